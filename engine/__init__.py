"""Specula's engine: token ids in, events out. A speculative decoding loop, its drafters and the worker
thread that owns the models. Depends on torch and transformers only; never imports Qt.

Output is lossless: greedy speculation reproduces the target's own greedy tokens, and sampling follows
the exact acceptance rule, so every emitted token is distributed as the target alone would draw it.
"""

__version__ = "0.1.0"
