"""The speculative loop and what it needs.

- `loop.py`: draft -> verify -> accept -> roll back -> emit events
- `verify.py`: one target pass over a draft chain or tree: what survives, the next token
- `sampling.py`: logits -> processed probabilities, and drawing from them
- `drafter.py`, `target.py`: the interfaces of a drafter (and `NoDraft`, plain decoding) and of a model
  with its own cache
- `batched.py`: plain decoding of many prompts at once through the compiled step (training's answers)
- `length.py`: each step's draft length; `speedup.py`: the live speedup measured inside an answer
- `detok.py`: the incremental detokenizer
"""
