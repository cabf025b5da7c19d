"""A GGUF file as it is: its metadata and tensors, read from the file without a converted copy, and the modules that
read their weights from it.

The header (metadata and tensor table) is read by api/gguf_header.py; the tensors are a copy-on-write
memory map of the file, so a tensor is its bytes where the file keeps them until something reads them
(`raw`), and reading them costs no memory beyond the pages touched, which `release` gives back once the
products have been packed from them. Nothing here knows a model family: models/from_gguf.py makes the config,
the tokenizer and the model from a file.

`NativeWeights` are the file's blocks of the Llama family's seven projections per layer and of the LM head
(`output`, or the token embedding a tied model shares) by transformers module name, for the lean forward's
products (cpu/products.py's `Blocks`); `FileEmbedding` and `FileHead` read an embedding's and a head's rows from
the file's own format.
"""

from __future__ import annotations

import logging
import mmap
import os
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..api.errors import ModelFileChanged, SpeculaError, UnsupportedModelError
from ..api.gguf_header import GGUFError, GGUFHeader, TensorEntry, read_header
from ..cpu.products import BLOCK_FORMATS, Blocks, FileBlocks, Q4Blocks

log = logging.getLogger(__name__)

NATIVE_TYPES = tuple(BLOCK_FORMATS)  # the formats the compiled step's products run as they are
LM_HEAD = "lm_head"  # the name the LM head's blocks go by
# the tokenizer's large arrays, which its builder reads itself
_TOKENIZER_ARRAYS = ("tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
_DENSE = {"F32": np.float32, "F16": np.float16}  # types numpy reads as they are (BF16 by its bits)
_STORED = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}  # types that are a dtype as they are


@dataclass
class NativeWeights:
    """The file's blocks by transformers module name ("model.layers.0.self_attn.q_proj", "lm_head"), and
    what the file held."""

    tensors: dict[str, FileBlocks] = field(default_factory=dict)
    file_types: Counter = field(default_factory=Counter)  # GGUF tensor type -> tensors of that type
    file: "GGUFFile | None" = field(default=None, repr=False, compare=False)  # where the bytes are, when a file's
    _q4: dict[str, Q4Blocks] | None = field(default=None, repr=False, compare=False)

    @property
    def blocks(self) -> dict[str, Q4Blocks]:
        """The 4-bit projections as torch's int4 kernel takes them (built once; tests' dense models only)."""
        if self._q4 is None:
            self._q4 = {name: q for name, t in self.tensors.items() if name != LM_HEAD and (q := t.q4()) is not None}
        return self._q4

    @property
    def summary(self) -> str:
        """e.g. "Q4_1 native (210 tensors), Q8_0 native (1 tensors); F32 x61 dense"."""
        native = Counter()
        for b in self.tensors.values():
            native[b.type_name] += 1
        rest = self.file_types - native
        parts = ", ".join(f"{t} native ({n} tensors)" for t, n in sorted(native.items()))
        others = ", ".join(f"{t} x{n}" for t, n in sorted(rest.items()))
        return parts + (f"; {others} dense" if others else "")


class GGUFFile:
    """One GGUF file: its header, and its tensors read from a memory map of it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.header: GGUFHeader = read_header(self.path, keep=lambda key: key not in _TOKENIZER_ARRAYS)
        except GGUFError as exc:
            raise GGUFError(f"cannot read GGUF file {self.path.name}: {exc}") from None
        except OSError as exc:
            raise SpeculaError(f"cannot read GGUF file {self.path}: {exc.strerror or exc}") from None
        self.tensors: dict[str, TensorEntry] = self.header.tensors
        self.metadata = self.header.metadata
        self.architecture = self.header.architecture
        # copy-on-write (never written): torch takes its pages as they are, and nothing is read until used; the file
        # stays open (closed with this object) to tell whether it changed under the map (check_unchanged)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        weakref.finalize(self, os.close, self._fd)
        self._opened = _identity(self._fd)
        self._map = mmap.mmap(self._fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self._array = np.frombuffer(self._map, dtype=np.uint8)

    def __repr__(self) -> str:
        return f"GGUFFile({self.path.name}, {self.architecture}, {len(self.tensors)} tensors)"

    def entry(self, name: str) -> TensorEntry:
        return self.tensors[name]

    def check_unchanged(self) -> None:
        """A one-line error where the file changed on disk since it was opened: reading a map past the end of a file
        cut short ends the process (a bus error), and rewritten bytes are other weights."""
        now = _identity(self._fd)
        if now != self._opened:
            how = (f"{self._opened[0]} bytes, now {now[0]}" if now[0] != self._opened[0] else
                   f"rewritten, still {now[0]} bytes")
            raise ModelFileChanged(f"{self.path.name} changed on disk since it was loaded ({how}): load it again")

    def raw(self, name: str) -> torch.Tensor:
        """A tensor's bytes where the file keeps them, (rows, bytes per row) uint8 (no copy); checked first that the
        file is as it was opened (the embedding's rows are read from it at every step)."""
        self.check_unchanged()
        e = self.tensors[name]
        rows = int(np.prod(e.shape[:-1])) if len(e.shape) > 1 else 1
        return torch.from_numpy(self._array[e.offset:e.offset + e.nbytes].reshape(rows, -1))

    def blocks(self, name: str, order: torch.Tensor | None = None) -> FileBlocks:
        """A 2-D tensor in one of BLOCK_FORMATS as the file stores it, its rows read in `order` where given (the
        bytes stay the file's: reordered only as they are packed)."""
        e = self.tensors[name]
        return FileBlocks(e.type_name, self.raw(name), (int(e.shape[0]), int(e.shape[1])), order)

    def view(self, name: str, dtype: torch.dtype) -> torch.Tensor | None:
        """A tensor stored in `dtype` itself (BF16, F16, F32) where the file keeps it, torch's shape (no copy), or
        None for any other type."""
        e = self.tensors[name]
        if _STORED.get(e.type_name) != dtype:
            return None
        return self.raw(name).view(dtype).reshape(e.shape)

    def dequantize(self, name: str, dtype: torch.dtype, rows: torch.Tensor | None = None) -> torch.Tensor:
        """A tensor's values in `dtype` and torch's shape (only its `rows` of a 2-D tensor when given): one
        tensor at a time, through fp32 (the gguf package's reference dequantization)."""
        e = self.tensors[name]
        if not e.known:
            raise UnsupportedModelError(f"{self.path.name}: tensor '{name}' is of GGML type {e.type_id}, "
                                        "which this version cannot read")
        data = self.raw(name).numpy()
        shape = e.shape
        if rows is not None:
            data, shape = data[rows.cpu().numpy()], (int(rows.numel()), *e.shape[1:])
        values = _values(data, e.type_name)
        return torch.from_numpy(values.reshape(shape)).to(dtype)

    def release(self) -> None:
        """Give back the pages read so far (they stay in the page cache, not in this process's memory): after
        the products were packed from them, only the few a later read touches come back."""
        try:
            self._map.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, OSError, ValueError):  # a platform without madvise: the pages stay
            pass


def _identity(fd: int) -> tuple[int, int]:
    """An open file's size and time of last change: what changes when it is cut short or written."""
    stat = os.fstat(fd)
    return stat.st_size, stat.st_mtime_ns


def _values(raw: np.ndarray, type_name: str) -> np.ndarray:
    """Bytes (..., bytes) of a GGML type -> fp32 values (the gguf package's reference)."""
    if type_name in _DENSE:
        return np.ascontiguousarray(raw).view(_DENSE[type_name]).astype(np.float32)
    if type_name == "BF16":
        return (np.ascontiguousarray(raw).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if type_name == "Q8_0":  # the bundled model's embedding, a row each step: the reference's arithmetic, inline
        blocks = np.ascontiguousarray(raw).reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (blocks, 1)
        return (d * blocks[:, 2:].view(np.int8).astype(np.float32)).reshape(*raw.shape[:-1], -1)
    from gguf import GGMLQuantizationType, dequantize

    try:
        return dequantize(np.ascontiguousarray(raw), GGMLQuantizationType[type_name]).astype(np.float32, copy=False)
    except (KeyError, NotImplementedError) as exc:
        raise UnsupportedModelError(f"GGML type {type_name} cannot be read by this version ({exc})") from None


class FileEmbedding(nn.Module):
    """The token embedding read from the file as it stores it: each row looked up is dequantized then."""

    def __init__(self, file: GGUFFile, name: str, dtype: torch.dtype, scale: float = 1.0) -> None:
        super().__init__()
        self.file, self.name, self.dtype = file, name, dtype
        self.num_embeddings, self.embedding_dim = file.entry(name).shape
        self.scalar_embed_scale = scale  # the rows looked up are multiplied by it in the model's dtype (Gemma's)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.file.dequantize(self.name, self.dtype, rows=ids.reshape(-1))  # (N, D)
        if self.scalar_embed_scale != 1.0:
            rows = rows * torch.tensor(self.scalar_embed_scale, dtype=self.dtype)
        return rows.to(ids.device).reshape(*ids.shape, self.embedding_dim)

    def rows(self, index) -> torch.Tensor:
        """Rows `index` (a tensor of ids, a slice) of the embedding as dense values."""
        return self.file.dequantize(self.name, self.dtype, rows=torch.arange(self.num_embeddings)[index].reshape(-1))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.file.entry(self.name).type_name} from the file"


class FileHead(nn.Module):
    """The LM head as the file's blocks through the compiled step's products: fp32 logits."""

    def __init__(self, product: Blocks, file: GGUFFile, name: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.product, self.file, self.name, self.dtype = product, file, name, dtype
        self.in_features, self.out_features = product.in_features, product.out_features

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        flat = h.reshape(-1, self.in_features).to(self.dtype)
        return self.product(flat).reshape(*h.shape[:-1], self.out_features)

    def rows(self, index) -> torch.Tensor:
        """Rows `index` (a tensor of ids, a slice) of the weight as dense values."""
        return self.file.dequantize(self.name, self.dtype, rows=torch.arange(self.out_features)[index].reshape(-1))

    def extra_repr(self) -> str:
        return f"{self.in_features} -> {self.out_features}, {self.product.source_type} from the file"


def weight_rows(module: nn.Module, index) -> torch.Tensor:
    """Rows of an embedding's or a linear layer's weight, from the file where the module reads it there."""
    rows = getattr(module, "rows", None)
    return rows(index) if rows is not None else module.weight[index]


def weight_dtype(module: nn.Module) -> torch.dtype:
    return module.dtype if isinstance(module, (FileEmbedding, FileHead)) else module.weight.dtype


def weight_device(module: nn.Module) -> torch.device:
    return torch.device("cpu") if isinstance(module, (FileEmbedding, FileHead)) else module.weight.device


def out_features(module: nn.Module) -> int:
    """Rows of an LM head (its vocabulary), whatever holds it."""
    return module.out_features if hasattr(module, "out_features") else module.weight.shape[0]
