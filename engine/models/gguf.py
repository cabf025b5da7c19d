"""A GGUF file's quantized weights as they are, for the lean forward's products.

transformers reads a GGUF by dequantizing every tensor (loading.py caches that as safetensors); the
model it builds stays the reference for names, shapes and everything the file does not hold in a
format Specula runs. This module reads the same file's Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K blocks of the Llama family's
seven projections per layer and of the LM head (`output`, or the token embedding a tied model shares),
undoes llama.cpp's row order for q and k, and checks the result against the dequantized model: the
blocks must give the weights transformers loaded (to the last bit of the model's dtype), or they are not
used. The compiled step runs them all through its own products; eager answers run the 4-bit ones
through torch's int4 kernel and the rest dense. Other tensor types (Q2_K/Q3_K, IQ types, fp16) stay
dequantized, with the count reported.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cpu.products import FileBlocks, Q4Blocks

log = logging.getLogger(__name__)

NATIVE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
LM_HEAD = "lm_head"  # the name the LM head's blocks go by
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
    """The file's blocks by transformers module name ("model.layers.0.self_attn.q_proj", "lm_head"), and
    what the file held."""

    tensors: dict[str, FileBlocks] = field(default_factory=dict)
    file_types: Counter = field(default_factory=Counter)  # GGUF tensor type -> tensors of that type
    _q4: dict[str, Q4Blocks] | None = field(default=None, repr=False, compare=False)

    @property
    def blocks(self) -> dict[str, Q4Blocks]:
        """The 4-bit projections as torch's int4 kernel takes them (built once)."""
        if self._q4 is None:
            self._q4 = {name: q for name, t in self.tensors.items() if name != LM_HEAD and (q := t.q4()) is not None}
        return self._q4

    @property
    def summary(self) -> str:
        """e.g. "Q4_1 native (210 tensors), Q8_0 native (1 tensors); F32 x61 dequantized"."""
        native = Counter()
        for b in self.tensors.values():
            native[b.type_name] += 1
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
    """The quantized projection blocks and LM head of a Llama-family GGUF, in transformers' names and row
    order."""
    import numpy as np
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    field_ = reader.fields.get("general.architecture")
    arch = bytes(field_.parts[field_.data[0]]).decode() if field_ is not None else ""
    n_head = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_head
    out = NativeWeights()
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"  # a tied model shares it
    for tensor in reader.tensors:
        type_name = tensor.tensor_type.name
        out.file_types[type_name] += 1
        match = _BLOCK_NAME.match(tensor.name)
        if type_name not in NATIVE_TYPES:
            continue
        if tensor.name == head:
            name, kind = LM_HEAD, "output"
        elif match is not None and match.group(2) in _PROJECTIONS:
            kind = match.group(2)
            name = f"model.layers.{match.group(1)}.{_PROJECTIONS[kind]}"
        else:
            continue
        shape = (int(tensor.shape[1]), int(tensor.shape[0]))  # GGUF lists dimensions innermost first
        data = torch.from_numpy(np.ascontiguousarray(tensor.data).view(np.uint8).reshape(shape[0], -1).copy())
        blocks = FileBlocks(type_name, data, shape)
        if arch == "llama" and kind in ("attn_q", "attn_k"):
            blocks = blocks.rows(_llama_row_order(shape[0], n_head if kind == "attn_q" else n_kv))
        out.tensors[name] = blocks
    return out


# inside the conversion folder, one level down: `specula export` copies that folder's files to serving
# engines, which would take any top-level *.safetensors for model weights
CACHE_NAME = "native/blocks.safetensors"
CACHE_FORMAT = "2:" + ",".join(NATIVE_TYPES)  # and the types read: a cache from before a type was added is rebuilt


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
    for name, b in native.tensors.items():
        tensors[name] = b.data.contiguous()
        kinds[name] = [b.type_name, *b.shape]
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
        for name, (type_name, rows, cols) in json.loads(meta["kinds"]).items():
            out.tensors[name] = FileBlocks(type_name, f.get_tensor(name), (rows, cols))
    return out


def check_against(native: NativeWeights, model: torch.nn.Module, layers: tuple[int, ...] = (0,)) -> str | None:
    """None when the blocks of `layers` (and the LM head's) give the model's own (dequantized) weights, to
    the last bit of the model's dtype; otherwise what differs. One layer catches a wrong row order or
    layout."""
    modules = dict(model.named_modules())
    for name, blocks in native.tensors.items():
        if name != LM_HEAD and int(name.split(".")[2]) not in layers:
            continue
        weight = modules[name].weight
        if tuple(weight.shape) != blocks.shape:
            return f"{name}: the file's shape {blocks.shape} is not the model's {tuple(weight.shape)}"
        if name == LM_HEAD:  # every 16th row of a vocabulary's: a wrong layout shows in any of them
            every = torch.arange(0, blocks.shape[0], 16)
            blocks, weight = blocks.rows(every), weight[every]
        # equal to the last bit of the dtype (the reference may round a Q4_K weight once differently)
        ours, theirs = blocks.dequantize().to(weight.dtype).float(), weight.detach().cpu().float()
        if not torch.allclose(ours, theirs, rtol=torch.finfo(weight.dtype).eps, atol=0.0):
            return f"{name}: the file's blocks do not give the weights transformers loaded"
    return None
