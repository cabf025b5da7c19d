"""A GGUF file's header, read without reading its tensors: the key/value metadata and the tensor table
(each tensor's name, type, shape and where its bytes are). Torch-free: the Models view reads it too.

Read here rather than with gguf.GGUFReader, which builds every field (the tokenizer's tokens and merges
included) before answering: about 4 s for the bundled model's header against a tenth of that here, and a
listing reads every GGUF it shows.

The layout (GGUF v2 and v3, little-endian): magic "GGUF", version u32, tensor count u64, key/value count
u64, the key/value pairs (key string, type u32, value), then per tensor its name string, n_dims u32,
n_dims u64 sizes (innermost first), type u32, offset u64 from the start of the data, which begins at the
next multiple of `general.alignment` (32 unless given) after the table. A string is a u64 length and its
UTF-8 bytes; an array is its element type u32, a u64 count and the elements.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .errors import SpeculaError

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def ggml_type(type_id: int) -> tuple[str, int, int] | None:
    """A GGML tensor type's name and the (weights, bytes) of one of its blocks, by the gguf package's tables (read
    where a tensor table is, not for the metadata alone); None for a type it does not know."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        kind = GGMLQuantizationType(type_id)
    except ValueError:
        return None
    weights, nbytes = GGML_QUANT_SIZES[kind]
    return kind.name, weights, nbytes


class GGUFError(SpeculaError):
    """The file is not a readable GGUF: the message says why in one line."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: `shape` in torch's order (outermost first: (out, in) for a weight), its
    bytes at `offset` from the start of the file."""

    name: str
    type_id: int
    type_name: str  # GGML's name of the type ("Q4_K"), or "type N" for one the gguf package does not know
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def known(self) -> bool:
        return not self.type_name.startswith("type ")


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict
    tensors: dict[str, TensorEntry]
    size: int  # the file's size in bytes

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


def read_header(path: Path, keep: Callable[[str], bool] = lambda key: True, tensors: bool = True) -> GGUFHeader:
    """The metadata whose keys `keep` accepts (arrays as lists) and, with `tensors`, the tensor table;
    a GGUFError naming what is wrong with a file that is not a whole GGUF (cut short, not a GGUF, a
    tensor past its end)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            if size == 0:
                raise GGUFError("the file is empty")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(buf, size, keep, tensors)
    except (struct.error, IndexError, UnicodeDecodeError, OverflowError, MemoryError):
        raise GGUFError(f"the file is truncated ({size} bytes)") from None


def _parse(buf, size: int, keep: Callable[[str], bool], with_tensors: bool) -> GGUFHeader:
    if buf[:4] != b"GGUF":
        raise GGUFError("it does not start with the GGUF magic bytes")
    version = struct.unpack_from("<I", buf, 4)[0]
    if version not in (1, 2, 3):
        raise GGUFError(f"GGUF version {version} is not one this reader knows (1 to 3)")
    count = "<I" if version == 1 else "<Q"
    width = struct.calcsize(count)
    n_tensors, n_kv = struct.unpack_from("<" + count[1] * 2, buf, 8)
    at = 8 + 2 * width
    if n_tensors > size or n_kv > size:
        raise GGUFError(f"the file is truncated ({size} bytes): its header counts {n_tensors} tensors and {n_kv} keys")

    def string(at: int) -> tuple[str, int]:
        (n,) = struct.unpack_from(count, buf, at)
        at += width
        if at + n > size:
            raise struct.error("past the end")
        return bytes(buf[at:at + n]).decode("utf-8", "replace"), at + n

    def value(kind: int, at: int, wanted: bool):
        if kind == 8:
            return string(at)
        if kind == 9:
            inner = struct.unpack_from("<I", buf, at)[0]
            (n,) = struct.unpack_from(count, buf, at + 4)
            at += 4 + width
            if inner in _SCALARS:
                step = struct.calcsize(_SCALARS[inner])
                if at + n * step > size:
                    raise struct.error("past the end")
                items = list(struct.unpack_from(f"<{n}{_SCALARS[inner][1]}", buf, at)) if wanted else None
                return items, at + n * step
            items = []
            for _ in range(n):
                item, at = value(inner, at, wanted)
                if wanted:
                    items.append(item)
            return items, at
        if kind not in _SCALARS:
            raise GGUFError(f"metadata of unknown type {kind}: the file is damaged")
        return struct.unpack_from(_SCALARS[kind], buf, at)[0], at + struct.calcsize(_SCALARS[kind])

    metadata = {}
    alignment = 32
    for _ in range(n_kv):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", buf, at)
        wanted = keep(key) or key == "general.alignment"
        item, at = value(kind, at + 4, wanted)
        if key == "general.alignment" and isinstance(item, int) and item > 0:
            alignment = item
        if wanted:
            metadata[key] = item
    table = []
    if with_tensors:
        for _ in range(n_tensors):
            name, at = string(at)
            (n_dims,) = struct.unpack_from("<I", buf, at)
            if n_dims > 8:
                raise GGUFError(f"tensor '{name}' has {n_dims} dimensions: the file is damaged")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, at + 4)
            type_id, offset = struct.unpack_from("<IQ", buf, at + 4 + 8 * n_dims)
            at += 4 + 8 * n_dims + 12
            table.append((name, type_id, tuple(reversed(dims)), offset))
    start = -(-at // alignment) * alignment
    tensors = {}
    for name, type_id, shape, offset in table:
        elements = 1
        for d in shape:
            elements *= d
        known = ggml_type(type_id)
        if known is not None:
            type_name, weights, nbytes = known
            if elements % weights:
                raise GGUFError(f"tensor '{name}' of {elements} weights is not whole {type_name} blocks")
            nbytes *= elements // weights
        else:
            type_name, nbytes = f"type {type_id}", 0  # an unknown type: refused where the tensor is read, with its name
        entry = TensorEntry(name, type_id, type_name, shape, start + offset, nbytes)
        if entry.offset + nbytes > size:
            raise GGUFError(f"the file is truncated ({size} bytes): tensor '{name}' ends at byte {entry.offset + nbytes}")
        tensors[name] = entry
    return GGUFHeader(metadata, tensors, size)
