"""Models from a source, ready to decode.

- `loading.py`: bundled, Hub id, folder or .gguf -> a loaded target (or draft) and its tokenizer
- `families/`: a model family as one small file; `spec_of(config)`: the values and shapes every forward runs on
  (`spec_for(model)`: a loaded model's, computed once)
- `layers.py`: a model's weights as products, `attention.py`: a pass's attention plans, `block.py`: a layer's norms,
  MLP and residual adds
- `runner.py`: Specula's own forward (`LeanRunner`), choosing a pass per answer; `cache.py`: the positions it holds;
  the passes over them: `eager.py`, `compiled.py` (through the compiled step), `static.py` (a GPU's static steps and
  CUDA graphs); `vocab.py`: a draft model's cut vocabulary
- `hf.py`: any other transformers model as a `ModelRunner`, `gguf.py` and `from_gguf.py`: a GGUF read as it is
"""
