"""Qwen2 and Qwen2.5: the Llama layer with q/k/v biases (read from the weights); windows by layer type."""

from . import Family

FAMILY = Family("qwen2", ("qwen2",), gguf_archs=("qwen2",))
