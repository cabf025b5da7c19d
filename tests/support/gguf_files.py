"""GGUF files written by the tests themselves (the gguf package's writer), as llama.cpp's converter and
quantizer lay them out: tiny Llama or Qwen2 models with the bundled model's tokenizer, each tensor in a
format of the test's choosing."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

# where a block the gguf package cannot quantize keeps its fp16 scales (d, dmin): random bytes elsewhere make a
# well-formed block; and (weights, bytes) of a block
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q2_K": (80, 82), "Q3_K": (108,), "IQ4_NL": (0,)}
_K_BYTES = {"Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210), "Q2_K": (256, 84), "Q3_K": (256, 110),
            "IQ4_NL": (32, 18)}


def tiny_llama(family: str = "llama", hidden: int = 256, inter: int = 512, layers: int = 2, vocab: int = 49152,
               tied: bool = True, seed: int = 0, bias: bool = False, rope_scaling: float = 0.0):
    """A random transformers model small enough to write in every format (inputs of 256: whole K-quant blocks).
    "gemma3" (text): llama.cpp's layout of it, five local layers (a window of 16 positions) to one global. "phi3":
    fused q/k/v and gate/up, Phi-4-mini's rotary, a window of 24 positions."""
    from tests.support.tiny import family_classes, longrope

    config_cls, model_cls = family_classes(family)
    extra = {"sliding_window": 16, "query_pre_attn_scalar": hidden // 4} if family == "gemma3" else {}
    if family == "gemma3" and rope_scaling:  # Gemma 3 4B's: linear, on the global layers only
        extra["rope_scaling"] = {"rope_type": "linear", "factor": rope_scaling}
    if family == "gemma2":  # soft-capped scores and logits, local and global layers in turn
        extra = {"sliding_window": 16, "query_pre_attn_scalar": hidden // 4, "attn_logit_softcapping": 5.0,
                 "final_logit_softcapping": 30.0}
    if family == "smollm3":  # token ids within the vocabulary (its defaults point past a small one)
        extra = {"pad_token_id": 0}
    if family == "granite":
        extra = {"embedding_multiplier": 12.0, "residual_multiplier": 0.22, "attention_multiplier": 0.0156,
                 "logits_scaling": 8.0}
    if family == "exaone4":  # a local layer and a global one without rotary in turn
        extra = {"sliding_window": 16, "sliding_window_pattern": 2}
    if family == "phi3":  # Phi-4-mini's rotary: over 3/4 of each head, longrope's factors (long ones past 64)
        extra = {"sliding_window": 24, "original_max_position_embeddings": 64, "pad_token_id": 0,
                 "rope_parameters": longrope(hidden // 4 * 3 // 8, seed + 1)}
    config = config_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=512,
                        tie_word_embeddings=tied, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, **extra)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # sharper distributions: greedy text with structure
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape) * (0.5 if bias else 0.0))
            elif "norm" in name:  # Gemma's norms scale by 1 + w
                p.copy_((0 if family.startswith("gemma") else 1) + 0.1 * torch.randn(p.shape))
    return model


@functools.cache
def _bundled_tokenizer() -> dict:
    """The bundled file's tokenizer metadata (read once: every file the tests write carries it; callers only read it)."""
    from specula.engine.api.gguf_header import read_header
    from specula.engine.api.paths import bundled_gguf_path

    return read_header(bundled_gguf_path(), keep=lambda key: key.startswith("tokenizer."), tensors=False).metadata


def random_k_blocks(type_name: str, rows: int, inputs: int, seed: int) -> np.ndarray:
    """Well-formed K-quant (or IQ4_NL) bytes (rows, bytes): random codes and scale bytes, small positive fp16 scales."""
    rng = np.random.default_rng(seed)
    weights, size = _K_BYTES[type_name]
    blocks = rng.integers(0, 256, size=(rows, inputs // weights, size), dtype=np.uint8)
    for at in _K_SCALES[type_name]:
        blocks[..., at:at + 2] = rng.uniform(1e-4, 1e-3, (rows, inputs // weights, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def _encode(weight: torch.Tensor, type_name: str, seed: int) -> tuple[np.ndarray, object]:
    """A 2-D weight in a GGUF type: (bytes or values, the type). K-quants (which the gguf package cannot
    quantize) are random well-formed blocks: the file, not the model, is then what the weights are."""
    from gguf import GGMLQuantizationType, quantize

    qtype = GGMLQuantizationType[type_name]
    values = weight.detach().float().numpy()
    if type_name in _K_BYTES:
        return random_k_blocks(type_name, *values.shape, seed=seed), qtype
    if type_name == "F32":
        return values, qtype
    if type_name == "F16":
        return values.astype(np.float16), qtype
    return quantize(values, qtype), qtype


def _llama_permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """What llama.cpp's converter does to Llama's q/k rows: each head's two rotary halves interleaved."""
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_gguf(path: Path, model, types: dict[str, str] | str = "Q8_0", arch: str | None = None,
               chat_template: bool = True, drop: tuple[str, ...] = (), extra: dict | None = None) -> Path:
    """`model` as a GGUF file at `path`; `types`: one type for every 2-D weight, or by role ("embed",
    "output", "attn_q", ..., "ffn_down", "default"). Norms and biases are F32 as llama.cpp writes them.
    `drop`: tensor names left out; `extra`: more tensors (name -> fp32 array)."""
    from gguf import GGMLQuantizationType, GGUFWriter

    cfg = model.config
    arch = arch or cfg.model_type.removesuffix("_text")
    gemma = arch.startswith("gemma")
    roles = {"default": types} if isinstance(types, str) else dict(types)
    writer = GGUFWriter(str(path), arch)
    writer.add_string("general.name", f"tiny {arch}")
    for key, value in (("block_count", cfg.num_hidden_layers), ("context_length", cfg.max_position_embeddings),
                       ("embedding_length", cfg.hidden_size), ("feed_forward_length", cfg.intermediate_size),
                       ("attention.head_count", cfg.num_attention_heads),
                       ("attention.head_count_kv", cfg.num_key_value_heads),
                       ("rope.dimension_count", cfg.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 1.0)),
                       ("attention.key_length", cfg.head_dim), ("attention.value_length", cfg.head_dim),
                       ("vocab_size", cfg.vocab_size)):
        writer.add_uint32(f"{arch}.{key}", int(value))
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)  # Gemma 3: the global layers' base
    writer.add_float32(f"{arch}.rope.freq_base", float(rope["rope_theta"]))
    if rope.get("rope_type") == "linear":  # as llama.cpp's converter writes it (Gemma 3 4B's global layers)
        writer.add_string(f"{arch}.rope.scaling.type", "linear")
        writer.add_float32(f"{arch}.rope.scaling.factor", float(rope["factor"]))
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", float(cfg.rms_norm_eps))
    if getattr(cfg, "sliding_window", None) and (gemma or arch == "exaone4"):
        writer.add_uint32(f"{arch}.attention.sliding_window", int(cfg.sliding_window))
    if arch == "exaone4" and cfg.sliding_window:  # which layers the window applies to, as llama.cpp's converter writes it
        writer.add_array(f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg.layer_types])
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):  # Gemma 2's
        if getattr(cfg, key, None):
            writer.add_float32(f"{arch}.{key}", float(getattr(cfg, key)))
    tok = _bundled_tokenizer()
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(tok.get("tokenizer.ggml.pre", "default"))
    writer.add_token_list(tok["tokenizer.ggml.tokens"])
    writer.add_token_types(tok["tokenizer.ggml.token_type"])
    writer.add_token_merges(tok["tokenizer.ggml.merges"])
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in tok:
            writer.add_uint32(f"tokenizer.ggml.{key}", int(tok[f"tokenizer.ggml.{key}"]))
    if chat_template:
        writer.add_chat_template(tok["tokenizer.chat_template"])
    names = {"model.embed_tokens.weight": ("token_embd.weight", "embed"), "model.norm.weight": ("output_norm.weight", None),
             "lm_head.weight": ("output.weight", "output")}
    layer_names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
                   "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                   "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
                   "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}  # Qwen3's per-head norms
    if arch == "granite":  # its four multipliers
        for key, name in (("embedding_scale", "embedding_multiplier"), ("residual_scale", "residual_multiplier"),
                          ("attention.scale", "attention_multiplier"), ("logit_scale", "logits_scaling")):
            writer.add_float32(f"granite.{key}", float(getattr(cfg, name)))
    if arch == "phi3":  # q/k/v and gate/up stored fused, as transformers' Phi-3 holds them
        layer_names.update({"self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output",
                            "mlp.gate_up_proj": "ffn_up"})
        rope = cfg.rope_parameters
        if cfg.sliding_window:
            writer.add_uint32("phi3.attention.sliding_window", int(cfg.sliding_window))
        if rope.get("rope_type") == "longrope":
            writer.add_uint32("phi3.rope.scaling.original_context_length", int(rope["original_max_position_embeddings"]))
            extra = {**(extra or {}), "rope_factors_long.weight": rope["long_factor"],
                     "rope_factors_short.weight": rope["short_factor"]}
    if arch in ("olmo2", "exaone4"):  # norms after attention and the MLP only
        layer_names.update({"post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"})
    if gemma:  # four norms a layer: around attention and around the MLP
        layer_names.update({"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                            "post_feedforward_layernorm": "post_ffw_norm"})
    for i in range(cfg.num_hidden_layers):
        for hf, gg in layer_names.items():
            for suffix in ("weight", "bias"):
                names[f"model.layers.{i}.{hf}.{suffix}"] = (f"blk.{i}.{gg}.{suffix}", gg if suffix == "weight" else None)
    state = model.state_dict()
    for n, (hf, (name, role)) in enumerate(names.items()):
        if hf not in state or name in drop or (hf == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        value = state[hf].detach().float()
        if arch in ("llama", "granite", "smollm3") and role in ("attn_q", "attn_k"):
            value = _llama_permute(value, cfg.num_attention_heads if role == "attn_q" else cfg.num_key_value_heads)
        if value.ndim == 1:
            if gemma and hf.endswith("norm.weight"):  # llama.cpp's converter stores Gemma's 1 + w
                value = value + 1
            writer.add_tensor(name, value.numpy())
            continue
        type_name = roles.get(role, roles.get("default", "Q8_0"))
        data, qtype = _encode(value, type_name, seed=n)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_dtype=qtype)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, np.asarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def _table_entry(data: bytes, path: Path, tensor: str) -> tuple[int, int]:
    """Where `tensor`'s name and its type (u32, then its data offset u64) are in the tensor table of the GGUF
    `data` read from `path`."""
    import struct

    from specula.engine.api.gguf_header import read_header

    key = tensor.encode()
    name = data.index(struct.pack("<Q", len(key)) + key) + 8  # past the name's length
    return name, name + len(key) + 4 + 8 * len(read_header(Path(path)).tensors[tensor].shape)  # past n_dims, dims


def data_offset(path: Path, tensor: str) -> int:
    """Where `tensor`'s bytes begin from the start of the file's data, as its tensor table counts."""
    data = Path(path).read_bytes()
    at = _table_entry(data, path, tensor)[1] + 4
    return int.from_bytes(data[at:at + 8], "little")


def damaged(path: Path, out: Path, tensor: str, type_id: int | None = None, offset: int | None = None,
            name: str | None = None) -> Path:
    """A copy at `out` of the GGUF at `path` whose tensor table gives `tensor` another type, data offset (as
    `data_offset` counts) or name (of the same length); the data itself is left as it was."""
    data = bytearray(Path(path).read_bytes())
    name_at, at = _table_entry(data, path, tensor)
    if type_id is not None:
        data[at:at + 4] = type_id.to_bytes(4, "little")
    if offset is not None:
        data[at + 4:at + 12] = offset.to_bytes(8, "little")
    if name is not None:
        assert len(name) == len(tensor), "a name of the same length keeps the table's layout"
        data[name_at:name_at + len(name)] = name.encode()
    Path(out).write_bytes(bytes(data))
    return Path(out)
