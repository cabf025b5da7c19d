"""Matrix products with a fixed weight, in the form that is fastest for it: y = x @ W^T (+ b).

Three forms, one call signature (`product(x)`, x (rows, in) -> (rows, out)):
- `Dense`: a bf16/fp16/fp32 weight through F.linear; on a CPU in bf16 the weight is prepacked once
  for oneDNN (about twice as fast as F.linear for the few rows a decoding step has).
- `Int4`: 4-bit codes in groups of 32 along the input, each group with a scale and an offset, through
  torch's weight-only int4 kernel. GGUF's Q4_0, Q4_1 and Q4_K blocks are exactly this shape, so their
  codes are used as they are (see `Q4Blocks`).
- `Blocks`: the file's own Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K blocks (`FileBlocks`) through the compiled step's
  products (native/blocks.h): the weights are read once for all the rows of a call, activations are
  quantized to int8 per block of 32 (per super-block of 256 for the K-quants, as ggml's Q8_K), and a row's bits
  never depend on the other rows (by construction,
  in every code path). The compiled step uses them where the library is built (`cpu/step.py`).

Every form gives a row the same bits whatever the other rows of the call are, from `stable_rows` rows on:
1 row for the int4 products and most prepacked ones on this machine's CPU, 2 for F.linear, which has a
one-row kernel of its own, and for oneDNN's longer sums (an MLP down projection). `stable_rows_of`
measures it per kind and shape where the model loads (kernels differ between CPUs and shapes). That is
what lossless verification needs: a token decoded alone and the same token inside a verify pass meet the
same arithmetic; where one row differs, a single step calls that product with two identical rows
(`in_rows`).

GGUF blocks of 32 weights w_j (ggml's layout):
- Q4_0: fp16 d, 16 bytes of nibbles q_j in 0..15;           w_j = (q_j - 8) * d
- Q4_1: fp16 d, fp16 m, 16 bytes of nibbles;                 w_j = q_j * d + m
- Q8_0: fp16 d, 32 int8 q_j;                                  w_j = q_j * d
- Q4_K: super-blocks of 8 such groups with 6-bit scales s and minimums m (`q4k_from_gguf`):
                                                             w_j = d * s * q_j - dmin * m
Byte i of a 4-bit block holds q_i in its low nibble and q_{i+16} in its high nibble.
torch's int4 kernel computes w_j = (q_j - 8) * scale + zero, so Q4_0 is (scale d, zero 0), Q4_1 is
(scale d, zero m + 8d) and a Q4_K group is (scale d * s, zero 8 * d * s - dmin * m). The kernel takes
scale and zero in the activations' dtype: in bf16 they round (to 8 significant bits), which moves each
weight by at most 0.046 of its group's step d on the bundled model (RMS 0.20% of the RMS weight;
docs/PERFORMANCE.md). Q8_0 (one fp16 scale per 32 int8 codes) has no exact int4 or int8-kernel form
(torch's int8 kernel takes one scale per row), so it stays dense.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..api.types import VERIFY_ROWS_MAX

GROUP = 32  # weights per GGUF block and per int4 group
# Passes of at least this many rows are prompt chunks (a verify pass has at most decoder.K_MAX + 1 rows,
# tested): there the int4 kernel, which redoes its dequantization for every 4 rows, is slower than a dense
# product over the model's dequantized weights, so `Int4` hands such passes to its dense twin.
PROMPT_ROWS = 64
_INNER_K_TILES = 2  # the int4 kernel's packing; 2, 4 and 8 time the same on the CPU


# The most rows a verify pass has (decoder.K_MAX + 1): the CPU's matrix kernels, dense and int4, give
# a row the bits it gets alone in any call of up to 32 rows here, and other bits beyond (measured).
_PROBE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 24, 31, VERIFY_ROWS_MAX)
PROBE_TRIES = 4  # products of a shape probed, each with its own random rows (stable_rows_of)


@torch.inference_mode()
def probe_stable_rows(product, dtype: torch.dtype, device: torch.device, seed: int = 0, least: int = 1) -> int:
    """How a single step must call this product so that a row gets the bits it gets inside any verify
    pass (up to VERIFY_ROWS_MAX rows): 1 when a lone row does (the prepacked and int4 products here), 2
    when only two identical rows do (F.linear, which has a one-row kernel of its own), 0 when neither.
    Kernels differ between CPUs, so this is measured where the model loads. A different bit is rare (a
    few of a call's 32 x 576 results), so one draw of random rows can miss it: callers probe several
    products of a shape with different `seed`s (`stable_rows_of`). `least`: the fewest rows worth trying
    (2 where another product of the shape already needed two)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(VERIFY_ROWS_MAX, product.in_features, generator=gen).to(dtype=dtype, device=device)
    for alone_rows in range(least, 3):
        alone = torch.cat([product(x[i : i + 1].expand(alone_rows, -1).contiguous())[:1] for i in range(len(x))])
        if all(torch.equal(product(x[:m]), alone[:m]) for m in _PROBE_ROWS if m >= alone_rows):
            return alone_rows
    return 0


def stable_rows_of(products: list, dtype: torch.dtype, device: torch.device, tries: int = PROBE_TRIES) -> int:
    """`probe_stable_rows` for products of one kind and shape: probed on up to `tries` of them spread over
    the list (their weights differ, and so do the sums that round apart), each with its own draw; the
    most rows any needs, 0 when one needs more than two."""
    picks = sorted({round(i * (len(products) - 1) / max(1, tries - 1)) for i in range(tries)})
    rows = 1
    for n, i in enumerate(picks):
        rows = probe_stable_rows(products[i], dtype, device, seed=n, least=rows)
        if rows == 0:
            break
    return rows


def in_rows(product, x: torch.Tensor) -> torch.Tensor:
    """product(x) with a call of fewer rows than the product's `stable_rows` run as that many, the first
    row repeated: a lone row then gets the bits it gets inside a verify pass (the products whose one-row
    kernel rounds differently, F.linear and oneDNN's longer sums)."""
    rows = x.shape[0]
    if rows >= product.stable_rows:
        return product(x)
    return product(torch.cat([x, x[:1].expand(product.stable_rows - rows, -1)]))[:rows]


@functools.cache
def dense_bf16_kernels() -> bool:
    """Whether oneDNN has bf16 kernels on this CPU (AVX-512 BF16 or AMX); without them a dense bf16 product
    runs several times slower than in fp32 (AVX2 machines)."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN's prepacked product applies: a CPU, and fp32, or bf16 on a CPU with bf16 support in oneDNN.
    In fp32 it is also the one form whose rows round alike in calls of two to 32 rows (F.linear's fp32
    kernel gives a row other bits as the call's row count changes), and about twice as fast for the LM
    head's few rows."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.float32:
        return True
    return weight.dtype == torch.bfloat16 and dense_bf16_kernels()


class Dense:
    """y = x @ W^T + b with a dense weight; prepacked for oneDNN when `prepack` and it applies."""

    kind = "dense"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, prepack: bool = False) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.source = weight  # as given (a fused weight is the base of its modules' own: no copy)
        self.packed = prepack and can_prepack(weight)
        self.kind = "prepacked" if self.packed else "dense"
        self.stable_rows = 2  # until `probe_stable_rows` measures it: F.linear has a one-row kernel of its own
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 2)  # opaque oneDNN layout
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


@dataclass(frozen=True)
class Q4Blocks:
    """A 4-bit weight (out, in) in groups of GROUP along `in`: w = (codes - 8) * scale + zero.

    codes: uint8 (out, in), values 0..15; scale, zero: fp32 (out, in // GROUP). fp32 holds GGUF's fp16
    d and m exactly, and m + 8d too unless m and d are more than 2^13 apart in magnitude."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    source_type: str  # "Q4_0", "Q4_1" or "Q4_K" ("Q4_0+Q4_1" and so on for stacked weights)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self, scale_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The fp32 weights (out, in) these blocks stand for; with `scale_dtype` bf16, as the int4 kernel
        sees them in bf16 (scale and zero rounded to bf16 first)."""
        scale = self.scale.to(scale_dtype).float().repeat_interleave(GROUP, dim=1)
        zero = self.zero.to(scale_dtype).float().repeat_interleave(GROUP, dim=1)
        return (self.codes.float() - 8) * scale + zero

    def rows(self, order: torch.Tensor) -> "Q4Blocks":
        """The same weight with its output rows reordered (GGUF permutes Llama's q/k rows)."""
        return Q4Blocks(self.codes[order], self.scale[order], self.zero[order], self.source_type)

    @staticmethod
    def cat(parts: list["Q4Blocks"]) -> "Q4Blocks":
        """Several weights of the same input stacked along the output (fused q/k/v, gate/up)."""
        kinds = {p.source_type for p in parts}
        return Q4Blocks(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                        torch.cat([p.zero for p in parts]), "+".join(sorted(kinds)))


def q4_from_gguf(raw: np.ndarray, type_name: str, shape: tuple[int, int]) -> Q4Blocks:
    """GGUF Q4_0/Q4_1 bytes (out, blocks * block_bytes) -> Q4Blocks of `shape` (out, in)."""
    out, inp = shape
    if inp % GROUP:
        raise ValueError(f"a 4-bit weight's input size {inp} is not a multiple of {GROUP}")
    head = {"Q4_0": 2, "Q4_1": 4}[type_name]  # bytes of fp16 d (and m) before the nibbles
    blocks = np.ascontiguousarray(raw).reshape(out, inp // GROUP, head + GROUP // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (out, groups)
    nib = blocks[..., head:]  # (out, groups, 16)
    codes = np.concatenate([nib & 0x0F, nib >> 4], axis=-1).reshape(out, inp)  # q_i, then q_{i+16}
    if type_name == "Q4_1":
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        zero = m + 8 * d
    else:
        zero = np.zeros_like(d)
    return Q4Blocks(torch.from_numpy(codes.astype(np.uint8)), torch.from_numpy(d), torch.from_numpy(zero), type_name)


Q4_K_BLOCK = 256  # weights per Q4_K super-block: 8 groups of 32 with 6-bit scales and minimums


def q4k_from_gguf(raw: np.ndarray, shape: tuple[int, int]) -> Q4Blocks:
    """GGUF Q4_K bytes (out, super-blocks * 144) -> Q4Blocks of `shape` (out, in).

    A super-block of 256 weights: fp16 d and dmin, 12 bytes packing eight 6-bit scales s_g and eight
    6-bit minimums m_g (bytes 0-3: the low 6 bits of s_0..s_3, bytes 4-7: of m_0..m_3, their top 2 bits
    the high bits of s_4..s_7 and m_4..m_7, whose low 4 bits are in bytes 8-11), then 128 bytes of
    nibbles: each 32 bytes hold group 2c in their low nibbles and group 2c + 1 in their high ones.
    w = d * s_g * q - dmin * m_g, so each group is an int4 group with scale d * s_g (exact in fp32)
    and zero 8 * d * s_g - dmin * m_g."""
    out, inp = shape
    if inp % Q4_K_BLOCK:
        raise ValueError(f"a Q4_K weight's input size {inp} is not a multiple of {Q4_K_BLOCK}")
    blocks = np.ascontiguousarray(raw).reshape(out, inp // Q4_K_BLOCK, 144)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)  # (out, supers, 1)
    dmin = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)
    low, high, mix = blocks[..., 4:8], blocks[..., 8:12], blocks[..., 12:16]
    s6 = np.concatenate([low & 63, (mix & 15) | ((low >> 6) << 4)], axis=-1)  # (out, supers, 8)
    m6 = np.concatenate([high & 63, (mix >> 4) | ((high >> 6) << 4)], axis=-1)
    nib = blocks[..., 16:].reshape(out, inp // Q4_K_BLOCK, 4, 1, 32)
    codes = np.concatenate([nib & 0x0F, nib >> 4], axis=3).reshape(out, inp)  # groups 2c, 2c + 1
    scale = (d * s6.astype(np.float32)).reshape(out, -1)  # (out, groups)
    zero = 8 * scale - (dmin * m6.astype(np.float32)).reshape(out, -1)
    return Q4Blocks(torch.from_numpy(codes.astype(np.uint8)), torch.from_numpy(scale), torch.from_numpy(zero), "Q4_K")


def q4_quantize(weight: torch.Tensor, type_name: str = "Q4_1") -> Q4Blocks:
    """Quantize a dense weight to Q4 blocks the way llama.cpp does: the tests' stand-in for a file's blocks."""
    return FileBlocks.quantize(weight, type_name).q4()


@dataclass(frozen=True)
class BlockFormat:
    """A GGUF block format `Blocks` runs as the file stores it: its name, GGML's number for it (the compiled step's
    `Format`), and the weights and bytes of one of its blocks (a K-quant's super-block) in a row."""

    name: str
    ggml_type: int
    inputs: int
    bytes: int


# The one table of the formats the own products run; blocks.h's `Format`, `file_inputs` and `file_bytes` and the gguf
# package's sizes are checked against it (tests/engine/test_blocks.py)
BLOCK_TABLE = (BlockFormat("Q4_0", 2, 32, 18), BlockFormat("Q4_1", 3, 32, 20), BlockFormat("Q5_0", 6, 32, 22),
               BlockFormat("Q5_1", 7, 32, 24), BlockFormat("Q8_0", 8, 32, 34), BlockFormat("Q4_K", 12, 256, 144),
               BlockFormat("Q5_K", 13, 256, 176), BlockFormat("Q6_K", 14, 256, 210))
TILE_COLS = 16  # outputs per tile of the packed blocks (native/blocks.h's COLS)
BLOCK_FORMATS = {f.name: f.ggml_type for f in BLOCK_TABLE}  # `Blocks`' file types, by GGML's number
_FILE_BLOCK = {f.name: (f.inputs, f.bytes) for f in BLOCK_TABLE}


@dataclass(frozen=True)
class FileBlocks:
    """One weight (out, in) as a GGUF file stores it: `data` (out, bytes per row) uint8, each row its
    blocks in input order, the rows in transformers' order."""

    type_name: str  # one of BLOCK_FORMATS
    data: torch.Tensor  # (out, bytes per row): the rows as stored (where a file keeps them: no copy)
    shape: tuple[int, int]
    order: torch.Tensor | None = None  # the stored rows in transformers' order (GGUF permutes Llama's q/k), or None

    def __post_init__(self) -> None:
        weights, size = _FILE_BLOCK[self.type_name]
        out, inp = self.shape
        if inp % weights or tuple(self.data.shape) != (out, inp // weights * size):
            raise ValueError(f"{self.type_name} bytes of shape {tuple(self.data.shape)} do not hold a weight {self.shape}")

    def ordered(self) -> torch.Tensor:
        """The bytes with the rows in transformers' order (a copy where `order` reorders them)."""
        return self.data if self.order is None else self.data[self.order]

    def rows(self, order: torch.Tensor) -> "FileBlocks":
        """The weight's output rows `order` (a check reads a few)."""
        return FileBlocks(self.type_name, self.ordered()[order].contiguous(), (len(order), self.shape[1]))

    def q4(self) -> Q4Blocks | None:
        """The 4-bit groups torch's int4 kernel takes (None for the other formats)."""
        raw = self.ordered().numpy()
        if self.type_name == "Q4_K":
            return q4k_from_gguf(raw, self.shape)
        if self.type_name in ("Q4_0", "Q4_1"):
            return q4_from_gguf(raw, self.type_name, self.shape)
        return None

    def dequantize(self) -> torch.Tensor:
        """The fp32 weights (out, in) the file's blocks stand for (the gguf package's reference)."""
        from gguf import GGMLQuantizationType, dequantize

        values = dequantize(self.ordered().numpy(), GGMLQuantizationType[self.type_name])
        return torch.from_numpy(values.reshape(self.shape).astype(np.float32))

    @staticmethod
    def quantize(weight: torch.Tensor, type_name: str) -> "FileBlocks":
        """A dense weight quantized the way llama.cpp does (the gguf package's reference quantizer): the
        tests' stand-in for a file's blocks."""
        from gguf import GGMLQuantizationType, quantize

        raw = quantize(weight.detach().float().cpu().numpy(), GGMLQuantizationType[type_name])
        return FileBlocks(type_name, torch.from_numpy(raw.view(np.uint8).reshape(weight.shape[0], -1)), tuple(weight.shape))


class Blocks:
    """y = x @ W^T + b with W as a file's blocks (several stacked along the output, each in its own format:
    fused q/k/v), through the compiled step's products; `ops` is the loaded library. `out_float`: fp32
    results (the LM head's logits), otherwise x's dtype."""

    kind = "blocks"

    def __init__(self, ops, parts: list[FileBlocks], bias: torch.Tensor | None, out_float: bool = False) -> None:
        if not parts or any(p.type_name not in BLOCK_FORMATS for p in parts) or len({p.shape[1] for p in parts}) != 1:
            raise ValueError(f"blocks of {', '.join(BLOCK_FORMATS)} over one input size")
        self.ops = ops
        self.in_features = parts[0].shape[1]
        self.out_features = sum(p.shape[0] for p in parts)
        self.source_type = "+".join(sorted({p.type_name for p in parts}))
        raws = [p.ordered() for p in parts]
        formats = [BLOCK_FORMATS[p.type_name] for p in parts]
        table, at = [], 0
        for raw, fmt, p in zip(raws, formats, parts):
            table.append([fmt, p.shape[0], at])
            at += ops.blocks_packed_bytes(raw.shape[0], raw.shape[1], fmt)
        self.packed = ops.blocks_pack_parts(raws, formats)  # the parts one after the other, packed in place
        self.parts = torch.tensor(table, dtype=torch.int64)
        self.bias = bias
        self.out_float = out_float
        self.stable_rows = 1  # a row's bits never depend on the call's other rows (tested)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.blocks_mm(x, self.packed, self.parts, self.bias, self.out_float)

    def first_rows(self, n: int) -> "Blocks":
        """The same product over its first n outputs only (n a whole number of tiles), reading the same packed
        bytes: a tile holds TILE_COLS outputs' blocks one after the other, so the first outputs are the first
        tiles (a draft model's LM head cut to the ids a target mostly emits). Self where n covers them all."""
        if n >= self.out_features:
            return self
        if n <= 0 or n % TILE_COLS or self.parts.shape[0] != 1 or self.bias is not None:
            raise ValueError(f"the first rows of one part without a bias, a multiple of {TILE_COLS}")
        cut = object.__new__(Blocks)
        cut.__dict__.update(self.__dict__)
        cut.out_features = n
        cut.parts = self.parts.clone()
        cut.parts[0, 1] = n
        return cut


class Tiles:
    """y = x @ W^T + b with a bf16 weight through the compiled step's own products (native/tiles.h): the
    weight reordered once into tiles of 16 outputs, read once for every row of a call, each output one fp32
    sum over the inputs by pairs (the arithmetic in tiles.h). Calls of PROMPT_ROWS rows or more (prompts) take oneDNN's product of the
    prepacked `dense` they were made from (as native/step.cpp does). `out_float`: fp32 results (the LM
    head's logits), otherwise x's dtype."""

    kind = "tiles"

    def __init__(self, ops, dense: Dense | None, out_float: bool = False, *, parts: list[torch.Tensor] = (),
                 bias: torch.Tensor | None = None) -> None:
        parts = [dense.source] if dense is not None else list(parts)
        if not parts or any(p.dtype != torch.bfloat16 for p in parts):
            raise ValueError("tiles are made from a bf16 weight")
        self.ops = ops
        self.dense = dense
        self.out_features, self.in_features = sum(p.shape[0] for p in parts), parts[0].shape[1]
        self.packed = ops.tiles_pack_parts(parts)
        if dense is not None:
            # oneDNN's layout for prompts, or the weight as it is (F.linear, 1.25x the time for a 256-row chunk
            # here) where no prepacked copy was made (a GGUF's tied bf16 head, where the file keeps it)
            self.weight = dense.weight
            self.kind = "tiles" if dense.packed else "tiles-plain"
            self.bias = dense.bias
        else:
            # the tiles alone (a GGUF's dense weights, `alone`): prompts unpack them for the call; the empty
            # (outputs, 0) tensor gives the compiled step their number
            self.weight = torch.empty((self.out_features, 0), dtype=torch.bfloat16)
            self.kind = "tiles-unpack"
            self.bias = bias
        self.out_float = out_float
        self.stable_rows = 1  # a row's bits never depend on the call's other rows (tested)

    @classmethod
    def alone(cls, ops, parts: list[torch.Tensor], bias: torch.Tensor | None) -> Tiles:
        """Tiles of the weight `parts` make stacked along the outputs (fused q/k/v: no stacked copy is made),
        with no other copy kept (the caller may drop the parts): prompts' calls unpack the tiles into one
        scratch weight of the calling thread and take F.linear over it, the same bits as over the weight."""
        return cls(ops, None, parts=parts, bias=bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= PROMPT_ROWS:
            if self.dense is None:
                y = self.ops.tiles_linear(x, self.packed, self.out_features, self.bias)
            else:
                y = self.dense(x)
            return y.float() if self.out_float else y
        return self.ops.tiles_mm(x, self.packed, self.out_features, self.bias, self.out_float)


def int4_fits(shape: tuple[int, int]) -> bool:
    """Whether torch's CPU int4 kernel takes a weight of this (out, in) shape."""
    return shape[0] % 16 == 0 and shape[1] % GROUP == 0


class Int4:
    """y = x @ W^T + b with W held as Q4Blocks, through torch's weight-only int4 kernel (CPU); prompt
    chunks of PROMPT_ROWS rows or more go to `dense` (the same weights as transformers dequantized them)
    when one is given."""

    kind = "int4"

    def __init__(self, blocks: Q4Blocks, bias: torch.Tensor | None, dtype: torch.dtype, dense: Dense | None = None) -> None:
        self.dense = dense
        self.stable_rows = 2  # until `probe_stable_rows` measures it
        self.out_features, self.in_features = blocks.shape
        self.source_type = blocks.source_type
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(blocks.codes.to(torch.int32), _INNER_K_TILES)
        # (in // GROUP, out, 2): the kernel's [scale, zero] per group and output
        self.scale_zero = torch.stack([blocks.scale.t(), blocks.zero.t()], dim=-1).to(dtype).contiguous()
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dense is not None and x.shape[0] >= PROMPT_ROWS:
            return self.dense(x)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), self.packed, GROUP, self.scale_zero)  # (rows, out)
        return y if self.bias is None else y + self.bias
