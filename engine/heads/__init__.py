"""Trained draft heads that reuse the target's own features.

- `eagle.py`, `eagle3.py`, `medusa.py`: the networks (EAGLE-1/2, EAGLE-3 reading three target layers, Medusa);
  `config.py`: their dimensions, head.json, the target's fingerprint
- `protocol.py`: what every head declares (what it reads, which layers, its draft vocabulary, how it drafts)
- `native.py`: an EAGLE head's layer through the compiled step, its products as a file format's blocks
- `published.py`: heads as their projects publish them (EAGLE-1/2, EAGLE-3, Medusa checkpoints)
- `store.py`: heads on disk: saved, read, checked against the target, found
- `made_for.py`: whether a head can fit a model, told from the head's file and the model's header before it is read
- `train/`: training one (prompts, answers, features, losses, fitting, evaluation, a whole run; its
  `__init__` names each module); `documents.py`: long texts for its prompts from what ships on the machine;
  `measure.py`: what a head knows, measured on prompts without a strategy's cost model
"""
