"""Phi-3 and Phi-4-mini: q/k/v and gate/up stored fused, one window over every layer, rotary over part of each head
(Phi-4-mini: 3/4) with longrope's factors. llama.cpp's files give the rotary as the rotated width and two tensors of
factors (read into the config here) and 0 for no window (Phi-4)."""

import torch

from . import Family, window_everywhere


def _gguf_config(file, values: dict) -> None:
    meta = file.metadata
    head_dim = values["hidden_size"] // values["num_attention_heads"]
    rotated = int(meta.get("phi3.rope.dimension_count") or head_dim)
    rope = {"rope_type": "default", "rope_theta": float(values.get("rope_theta", 10000.0)),
            "partial_rotary_factor": rotated / head_dim}
    if "rope_factors_long.weight" in file.tensors and "rope_factors_short.weight" in file.tensors:
        original = int(meta.get("phi3.rope.scaling.original_context_length") or values["max_position_embeddings"])
        rope.update(rope_type="longrope", original_max_position_embeddings=original,
                    long_factor=file.dequantize("rope_factors_long.weight", torch.float32).tolist(),
                    short_factor=file.dequantize("rope_factors_short.weight", torch.float32).tolist())
        values["original_max_position_embeddings"] = original
    values["rope_parameters"] = rope
    values.pop("rope_scaling", None)  # longrope is the rotary's scaling here
    window = meta.get("phi3.attention.sliding_window")
    values["sliding_window"] = int(window) if window else None


FAMILY = Family("phi3", ("phi3",), gguf_archs=("phi3",), qkv=("self_attn.qkv_proj",), gate_up=("mlp.gate_up_proj",),
                windows=window_everywhere, gguf_config=_gguf_config)
