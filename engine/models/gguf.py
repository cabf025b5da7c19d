"""A GGUF file's 4-bit projection weights as they are, for the lean forward's int4 products.

transformers reads a GGUF by dequantizing every tensor (loading.py caches that as safetensors); the
model it builds stays the reference for names, shapes and everything that is not a 4-bit projection.
This module reads the same file's Q4_0/Q4_1/Q4_K blocks of the Llama family's seven projections per
layer, undoes llama.cpp's row order for q and k, and checks the result against the dequantized model:
the blocks must give the weights transformers loaded (to the last bit of the model's dtype), or they are
not used. Other tensor types (Q8_0, Q5/Q6_K, fp16) stay dequantized, with the count reported: in a
Q4_K_M file, the Q6_K projections run dense and the Q4_K ones as int4.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cpu.products import Q4Blocks, q4_from_gguf, q4k_from_gguf

log = logging.getLogger(__name__)

NATIVE_TYPES = ("Q4_0", "Q4_1", "Q4_K")
_PROJECTIONS = {  # GGUF name in block i -> the transformers module under model.layers[i]
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")


@dataclass
class NativeWeights:
    """4-bit blocks by transformers module name ("model.layers.0.self_attn.q_proj"), and what the file held."""

    blocks: dict[str, Q4Blocks] = field(default_factory=dict)
    file_types: Counter = field(default_factory=Counter)  # GGUF tensor type -> tensors of that type

    @property
    def summary(self) -> str:
        """e.g. "Q4_1 native (210 tensors); Q8_0 x1, F32 x61 dequantized"."""
        native = Counter()
        for b in self.blocks.values():
            native[b.source_type] += 1
        rest = self.file_types - native
        parts = ", ".join(f"{t} native ({n} tensors)" for t, n in sorted(native.items()))
        others = ", ".join(f"{t} x{n}" for t, n in sorted(rest.items()))
        return parts + (f"; {others} dequantized" if others else "")


def _llama_row_order(rows: int, n_head: int) -> torch.Tensor:
    """llama.cpp stores each head's q/k rows interleaved for its rotary; this index restores
    transformers' order: hf_rows = gguf_rows[order]."""
    half = rows // n_head // 2
    return torch.arange(rows).reshape(n_head, half, 2).transpose(1, 2).reshape(-1)


def read_native_weights(path: Path, config) -> NativeWeights:
    """The 4-bit projection blocks of a Llama-family GGUF, in transformers' names and row order."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field_ = reader.fields.get("general.architecture")
    arch = bytes(field_.parts[field_.data[0]]).decode() if field_ is not None else ""
    n_head = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    out = NativeWeights()
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        out.file_types[type_name] += 1
        match = _BLOCK_NAME.match(tensor.name)
        if type_name not in NATIVE_TYPES or match is None or match.group(2) not in _PROJECTIONS:
            continue
        shape = (int(tensor.shape[1]), int(tensor.shape[0]))  # GGUF lists dimensions innermost first
        if type_name == "Q4_K":
            blocks = q4k_from_gguf(tensor.data, shape)
        else:
            blocks = q4_from_gguf(tensor.data, type_name, shape)
        kind = match.group(2)
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            blocks = blocks.rows(_llama_row_order(shape[0], n_head if kind == "attn_q" else n_kv))
        out.blocks[f"model.layers.{match.group(1)}.{_PROJECTIONS[kind]}"] = blocks
    return out


# inside the conversion folder, one level down: `specula export` copies that folder's files to serving
# engines, which would take any top-level *.safetensors for model weights
CACHE_NAME = "native/q4.safetensors"
CACHE_FORMAT = "1"  # bump when what read_native_weights produces changes: older caches are rebuilt


def cached_native_weights(path: Path, config, folder: Path) -> NativeWeights:
    """`read_native_weights`, kept in `folder` (the GGUF's conversion folder, keyed by the file's path,
    size and modification time) so later loads skip parsing the file: about 3 s for the bundled model.
    An unreadable cache is rebuilt; one that cannot be written is skipped."""
    cache = folder / CACHE_NAME
    if cache.is_file():
        try:
            return _read_cache(cache)
        except Exception as exc:  # safetensors raises its own error types on a damaged file
            log.info("rebuilding %s: %s", cache, exc)
    native = read_native_weights(path, config)
    try:
        cache.parent.mkdir(exist_ok=True)
        _write_cache(native, cache)
    except OSError as exc:
        log.info("could not keep the 4-bit weights in %s: %s", cache, exc)
    return native


def _write_cache(native: NativeWeights, cache: Path) -> None:
    import json
    import os
    import tempfile

    from safetensors.torch import save_file

    tensors, kinds = {}, {}
    for name, b in native.blocks.items():
        tensors[f"{name}.codes"] = (b.codes[:, 0::2] | (b.codes[:, 1::2] << 4)).contiguous()  # two codes a byte
        tensors[f"{name}.scale"] = b.scale.contiguous()
        tensors[f"{name}.zero"] = b.zero.contiguous()
        kinds[name] = b.source_type
    meta = {"format": CACHE_FORMAT, "kinds": json.dumps(kinds), "file_types": json.dumps(dict(native.file_types))}
    fd, tmp = tempfile.mkstemp(prefix=".native-", dir=cache.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, cache)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _read_cache(cache: Path) -> NativeWeights:
    import json

    from safetensors import safe_open

    out = NativeWeights()
    with safe_open(str(cache), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != CACHE_FORMAT:
            raise ValueError(f"cache format {meta.get('format')!r}, not {CACHE_FORMAT}")
        out.file_types = Counter(json.loads(meta["file_types"]))
        for name, kind in json.loads(meta["kinds"]).items():
            packed = f.get_tensor(f"{name}.codes")  # (out, in / 2)
            codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
            out.blocks[name] = Q4Blocks(codes, f.get_tensor(f"{name}.scale"), f.get_tensor(f"{name}.zero"), kind)
    return out


def check_against(native: NativeWeights, model: torch.nn.Module, layers: tuple[int, ...] = (0,)) -> str | None:
    """None when the blocks of `layers` give the model's own (dequantized) weights, to the last bit of
    the model's dtype; otherwise what differs. One layer catches a wrong row order or layout."""
    modules = dict(model.named_modules())
    for name, blocks in native.blocks.items():
        if int(name.split(".")[2]) not in layers:
            continue
        weight = modules[name].weight
        if tuple(weight.shape) != blocks.shape:
            return f"{name}: the file's shape {blocks.shape} is not the model's {tuple(weight.shape)}"
        # equal to the last bit of the dtype: our (q - 8) * scale + zero and the reference's
        # d * s * q - dmin * m may round once differently in fp32 (Q4_K); a wrong layout is far off
        ours, theirs = blocks.dequantize().to(weight.dtype).float(), weight.detach().cpu().float()
        if not torch.allclose(ours, theirs, rtol=torch.finfo(weight.dtype).eps, atol=0.0):
            return f"{name}: the file's 4-bit blocks do not give the weights transformers loaded"
    return None
