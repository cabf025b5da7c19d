"""EXAONE 4: OLMo 2's norms of the outputs (of Llama's kind), Qwen3's per-head q/k norms, and local layers with one
global layer in four, where the global layers take no rotary (where the config has a window; without one every layer
is global and rotates). llama.cpp's files give the window and which layers it applies to (a flag a layer)."""

from . import LLAMA_KEYS, OUTPUT_NORMS, Family, windows_by_layer_type


def _rotary(config) -> tuple[bool, ...]:
    return tuple(not config.sliding_window or w > 0 for w in windows_by_layer_type(config))


def _gguf_config(file, values: dict) -> None:
    pattern = file.metadata.get("exaone4.attention.sliding_window_pattern")
    if values.get("sliding_window") and isinstance(pattern, list) and len(pattern) == values.get("num_hidden_layers"):
        values["layer_types"] = ["sliding_attention" if local else "full_attention" for local in pattern]


FAMILY = Family("exaone4", ("exaone4",), gguf_archs=("exaone4",), norms=OUTPUT_NORMS, qk_norms="head", rotary=_rotary,
                gguf_keys={**LLAMA_KEYS, "attention.sliding_window": "sliding_window"}, gguf_config=_gguf_config)
