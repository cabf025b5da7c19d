"""Trained draft heads that reuse the target's own features.

- `eagle.py`, `medusa.py`: the networks; `config.py`: their dimensions, head.json, the target's fingerprint
- `store.py`: heads on disk: saved, read, checked against the target, found; `train.py`: training one
"""
