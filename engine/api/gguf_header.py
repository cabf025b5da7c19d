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

_MAX_DEPTH = 8  # arrays of arrays a key's value may nest (llama.cpp's reader takes none)
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
    tensor misaligned, overlapping another or past its end: llama.cpp refuses these too)."""
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

    def value(kind: int, at: int, wanted: bool, depth: int = 0):
        if kind == 8:
            return string(at)
        if kind == 9:
            if depth >= _MAX_DEPTH:  # llama.cpp reads no array of arrays; a deeper one would exhaust Python's stack
                raise GGUFError(f"its metadata nests arrays more than {_MAX_DEPTH} deep: the file is damaged")
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
                item, at = value(inner, at, wanted, depth + 1)
                if wanted:
                    items.append(item)
            return items, at
        if kind not in _SCALARS:
            raise GGUFError(f"metadata of unknown type {kind}: the file is damaged")
        return struct.unpack_from(_SCALARS[kind], buf, at)[0], at + struct.calcsize(_SCALARS[kind])

    metadata = {}
    alignment = None
    for _ in range(n_kv):
        key, at = string(at)
        (kind,) = struct.unpack_from("<I", buf, at)
        wanted = keep(key) or key == "general.alignment"
        item, at = value(kind, at + 4, wanted)
        if key == "general.alignment":
            alignment = item
        if wanted:
            metadata[key] = item
    alignment = _alignment(alignment)
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
        if name in tensors:
            raise GGUFError(f"tensor '{name}' is listed twice in the tensor table: the file is damaged")
        if offset % alignment:
            raise GGUFError(f"tensor '{name}' is misaligned: its offset {offset} is not a multiple of the file's "
                            f"alignment ({alignment}): the file is damaged")
        tensors[name] = _entry(name, type_id, shape, start + offset)
    _check_layout(list(tensors.values()), start, size, alignment)
    return GGUFHeader(metadata, tensors, size)


def _alignment(value) -> int:
    """`general.alignment`: 32 where the file gives none; a GGUFError for one that is not a power of two (as
    llama.cpp refuses it)."""
    if value is None:
        return 32
    if not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise GGUFError(f"general.alignment is {value!r}, not a power of two: the file is damaged")
    return value


def _entry(name: str, type_id: int, shape: tuple[int, ...], offset: int) -> TensorEntry:
    """A tensor of the table, its size in bytes by its type (0 for a type the gguf package does not know)."""
    elements = 1
    for d in shape:
        elements *= d
    known = ggml_type(type_id)
    if known is None:  # an unknown type: refused where the tensor is read, with its name
        return TensorEntry(name, type_id, f"type {type_id}", shape, offset, 0)
    type_name, weights, nbytes = known
    if elements % weights:
        raise GGUFError(f"tensor '{name}' of {elements} weights is not whole {type_name} blocks")
    return TensorEntry(name, type_id, type_name, shape, offset, nbytes * (elements // weights))


def _check_layout(entries: list[TensorEntry], start: int, size: int, alignment: int) -> None:
    """A GGUFError naming the first tensor whose bytes overlap another's, lie past the end of the file or leave a
    gap after another (`_check_gaps`), from the table alone: no tensor's bytes are read. A file shorter than its tensors laid end to end (each padded
    to the alignment, as every writer lays them) was cut short: "truncated"; a file long enough that still has
    a tensor past its end has a damaged offset."""
    ordered = sorted(entries, key=lambda e: (e.offset, e.nbytes))
    for before, after in zip(ordered, ordered[1:]):
        if before.offset + before.nbytes > after.offset:
            raise GGUFError(f"tensor '{before.name}' (bytes {before.offset} to {before.offset + before.nbytes}) "
                            f"overlaps tensor '{after.name}' (from byte {after.offset}): the file is damaged")
    past = next((e for e in ordered if e.offset + e.nbytes > size), None)
    if past is None:
        _check_gaps(ordered, start, size, alignment)
        return
    end = past.offset + past.nbytes
    laid_out = start + sum(-(-e.nbytes // alignment) * alignment for e in ordered[:-1]) + ordered[-1].nbytes
    if laid_out > size:
        raise GGUFError(f"the file is truncated ({size} bytes): tensor '{past.name}' ends at byte {end}")
    raise GGUFError(f"tensor '{past.name}' lies past the end of the file (its bytes end at {end}, the file at "
                    f"{size}): its offset is damaged")


def _check_gaps(ordered: list[TensorEntry], start: int, size: int, alignment: int) -> None:
    """A GGUFError naming the first place where the tensors do not follow each other as every writer lays them (each
    at the end of the one before, padded to the alignment; the first at the start of the data; the file ending with
    the last): a tensor whose type was changed to a smaller one leaves a gap where its bytes were read as other
    weights. llama.cpp refuses the gaps too (it reads no bytes past the last tensor, which a smaller last tensor
    leaves). A tensor of a type the gguf package does not know has no known size: what follows it is not checked."""
    def padded(at: int) -> int:
        return -(-at // alignment) * alignment

    where, before = start, None
    for entry in ordered:
        if where is not None and entry.offset != where and before is None:
            raise GGUFError(f"the first tensor '{entry.name}' begins {entry.offset - where} bytes into the file's "
                            "data, not at its start: its offset is damaged")
        if where is not None and entry.offset != where:
            raise GGUFError(f"{entry.offset - where} bytes lie between tensor '{before.name}' ({before.type_name}, "
                            f"{before.nbytes} bytes) and tensor '{entry.name}', which every writer lays end to end: "
                            f"the type of '{before.name}' or the offset of '{entry.name}' is damaged")
        where, before = (padded(entry.offset + entry.nbytes) if entry.known else None), entry
    if where is not None and before is not None and size - before.offset - before.nbytes >= alignment:
        raise GGUFError(f"the file goes on {size - before.offset - before.nbytes} bytes past its last tensor "
                        f"'{before.name}' ({before.type_name}, {before.nbytes} bytes): a tensor's type is damaged")
