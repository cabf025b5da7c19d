"""Qwen3: the Llama layer with each query and key head normed before rotary."""

from . import Family

FAMILY = Family("qwen3", ("qwen3",), gguf_archs=("qwen3",), qk_norms="head")
