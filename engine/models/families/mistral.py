"""Mistral: the Llama layer with one sliding window over every layer."""

from . import Family, window_everywhere

FAMILY = Family("mistral", ("mistral",), gguf_archs=(), windows=window_everywhere, gguf_named=("llama", "mistral"))
