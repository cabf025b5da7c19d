"""Gemma 3 (its text model): Gemma 2's layer with per-head q/k norms, no soft-caps, and a rotary table per kind of
layer (local and global bases)."""

from dataclasses import replace

from .gemma2 import FAMILY as GEMMA2

FAMILY = replace(GEMMA2, name="gemma3", model_types=("gemma3_text",), gguf_archs=("gemma3",), qk_norms="head")
