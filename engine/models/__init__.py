"""Models from a source, ready to decode.

- `loading.py`: bundled, Hub id, folder or .gguf -> a loaded target (or draft) and its tokenizer
- `llama.py`: the lean forward for the Llama family over a static cache (`ModelRunner`)
- `hf.py`: any other transformers model as a `ModelRunner`, `gguf.py`: a GGUF's 4-bit blocks as they are
"""
