"""Llama (and what llama.cpp writes as Llama: Llama 2/3, SmolLM2, TinyLlama, ...): the layer every default describes."""

from . import Family

FAMILY = Family("llama", ("llama",), gguf_archs=("llama",), gguf_permuted_qk=True)
