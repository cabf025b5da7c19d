"""Gemma 2: four norms a layer (around attention and around the MLP) scaling by 1 + w in fp32, GELU-tanh, local and
global layers by layer type, queries scaled by query_pre_attn_scalar, attention scores and logits soft-capped."""

from . import Family, sqrt_scale

GEMMA_NORMS = (("attn_in", "input_layernorm"), ("mlp_in", "pre_feedforward_layernorm"),
               ("attn_out", "post_attention_layernorm"), ("mlp_out", "post_feedforward_layernorm"))


def gemma_gguf_config(file, values: dict) -> None:
    """What llama.cpp's Gemma files leave to the reader: the queries' scale (the heads' width; the 27B models',
    46 and 62 layers, hidden / heads) and Gemma 2's soft-caps."""
    arch = file.architecture
    if "query_pre_attn_scalar" not in values and "head_dim" in values:
        wide = values.get("num_hidden_layers") == {"gemma2": 46, "gemma3": 62}[arch]
        values["query_pre_attn_scalar"] = values["hidden_size"] // values["num_attention_heads"] if wide else values["head_dim"]
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if isinstance(file.metadata.get(f"{arch}.{key}"), (int, float)) and key not in values:
            values[key] = float(file.metadata[f"{arch}.{key}"])


FAMILY = Family("gemma2", ("gemma2",), gguf_archs=("gemma2",), norms=GEMMA_NORMS, norm_offset=1.0, wide_norms=True,
                scale=sqrt_scale("query_pre_attn_scalar"), gguf_offset_norms=True, gguf_config=gemma_gguf_config)
