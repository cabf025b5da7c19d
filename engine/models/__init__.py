"""Models from a source, ready to decode.

- `loading.py`: bundled, Hub id, folder or .gguf -> a loaded target (or draft) and its tokenizer
- `families/`: a model family as one small file; `spec_of(config)`: the values every forward runs on
- `layers.py`: a model's weights as products, `attention.py`: a pass's attention plans, `block.py`: a layer's norms,
  MLP and residual adds
- `runner.py`: Specula's own forward over its cache (`LeanRunner`: eager), `compiled.py`: its passes through the
  compiled step, `static.py`: a GPU's static steps and CUDA graphs
- `hf.py`: any other transformers model as a `ModelRunner`, `gguf.py` and `from_gguf.py`: a GGUF read as it is
"""
