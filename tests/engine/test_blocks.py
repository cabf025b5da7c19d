"""The compiled step's own products over a file's blocks (engine/cpu/native/blocks.h, `Blocks`): every
format, code path and row count gives a row the bits it gets alone, every path gives the same bits, and
the result is the plain block arithmetic (activations quantized per block of 32 for the legacy formats and per
super-block of 256 for the K-quants, exact integer sums)."""

import numpy as np
import pytest
import torch

from specula.engine.cpu import step as compiled
from specula.engine.cpu.products import _FILE_BLOCK, BLOCK_FORMATS, Blocks, FileBlocks

PATHS = {"portable": 1, "avx2": 2, "avx512": 3, "amx": 4}


def _paths(ops) -> list[str]:
    """The code paths this CPU can run (a path it lacks is refused)."""
    usable = []
    for name, number in PATHS.items():
        try:
            ops.blocks_path(number)
            usable.append(name)
        except RuntimeError as exc:
            assert "cannot run kernel path" in str(exc)
    ops.blocks_path(0)
    return usable


def _call(ops, path: str, product, x: torch.Tensor) -> torch.Tensor:
    """product(x) on a forced code path (Blocks and Tiles alike)."""
    ops.blocks_path(PATHS[path])
    try:
        return product(x)
    finally:
        ops.blocks_path(0)


K_QUANTS = {"Q4_K": (144, (0, 2)), "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,))}  # bytes per 256 weights, offsets of fp16 scales


def _weight(out: int, inp: int, seed: int, type_name: str) -> FileBlocks:
    """A weight in `type_name`: quantized from random weights (gguf's quantizer), or for the K-quants (which
    it cannot quantize) random super-blocks with small positive fp16 scales."""
    gen = torch.Generator().manual_seed(seed)
    if type_name in K_QUANTS:
        size, scales = K_QUANTS[type_name]
        raw = torch.randint(0, 256, (out, inp // 256, size), generator=gen, dtype=torch.uint8)
        for at in scales:
            d = (torch.rand(out, inp // 256, generator=gen) * 0.01 + 1e-4).half()
            raw[..., at : at + 2] = d.view(torch.uint8).reshape(out, inp // 256, 2)
        if out > 3:
            raw[3, :, scales[0] : scales[0] + 2] = 0  # a column whose scales are zero
        return FileBlocks(type_name, raw.reshape(out, -1), (out, inp))
    w = torch.randn(out, inp, generator=gen) * 0.05
    w[:, :32] *= 40  # blocks of very different scales
    if out > 3:
        w[3] = 0  # a column of zero blocks
    return FileBlocks.quantize(w, type_name)


def quantized(x: np.ndarray, span: int) -> tuple[np.ndarray, np.ndarray]:
    """x (rows, k) quantized as the kernels do, one scale per `span` inputs: codes (rows, k / span, span) in float64
    and scales (rows, k / span)."""
    rows, k = x.shape
    xs = x.reshape(rows, k // span, span)
    d = (np.abs(xs).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    return np.rint(xs * inv[..., None]).astype(np.float64), d.astype(np.float64)  # round half to even, as the kernels


def reference(x: torch.Tensor, parts: list[FileBlocks], bias: torch.Tensor | None = None) -> torch.Tensor:
    """The block arithmetic written plainly in float64: x quantized per block of 32 (legacy formats) or per super-block
    of 256 (K-quants) as the kernels do, each span's sum over the file's weights (the gguf package's dequantizer) times
    its scale dx."""
    x = x.float().numpy()
    rows, k = x.shape
    outs = []
    for p in parts:
        span = 256 if p.type_name in K_QUANTS else 32
        q, d = quantized(x, span)
        w = p.dequantize().double().numpy().reshape(p.shape[0], k // span, span)
        outs.append(np.einsum("obj,rbj,rb->ro", w, q, d))
    y = np.concatenate(outs, axis=1)
    if bias is not None:
        y += bias.float().numpy()
    return torch.from_numpy(y)


@pytest.mark.parametrize("type_name", sorted(BLOCK_FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_path_and_row_count_gives_a_row_its_own_bits(ops, type_name, dtype):
    k = 512 if type_name in K_QUANTS else 576
    weight = _weight(200, k, seed=1, type_name=type_name)  # 200 columns: a part-filled last tile
    product = Blocks(ops, [weight], None, out_float=True)
    x = (torch.randn(32, k, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    x[5, 64:96] = 0  # a block of zeros
    paths = _paths(ops)
    assert "portable" in paths
    results = {path: _call(ops, path, product, x) for path in paths}
    for path in paths:  # the same bits on every path
        assert torch.equal(results[path], results["portable"]), path
    for path in paths:  # any number of rows: each row's bits are its own
        alone = torch.cat([_call(ops, path, product, x[i : i + 1]) for i in range(32)])
        for rows in range(1, 33):
            assert torch.equal(_call(ops, path, product, x[:rows]), alone[:rows]), (path, rows)
    ref = reference(x, [weight])
    assert torch.allclose(results["portable"].double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max())
    if type_name not in K_QUANTS:  # random super-blocks are no weights; quantized ones are
        dense = x.float() @ weight.dequantize().T  # the activations' int8 rounding: about 1 part in 200
        assert ((results["portable"] - dense).norm() / dense.norm()) < 0.02


# the bytes of a block (or super-block) that hold codes, by format: (start, end) in the file's block
CODE_BYTES = {"Q4_0": [(2, 18)], "Q4_1": [(4, 20)], "Q5_0": [(2, 22)], "Q5_1": [(4, 24)], "Q8_0": [(2, 34)],
              "Q4_K": [(16, 144)], "Q5_K": [(16, 176)], "Q6_K": [(0, 192)]}


@pytest.mark.parametrize("type_name", sorted(BLOCK_FORMATS))
def test_the_largest_codes_against_the_largest_inputs_sum_exactly(ops, type_name):
    """Every code at its largest (Q8_0: at -128 and 127) against inputs that all quantize to +-127: the
    integer sums the vector paths keep in 16 bits before widening them reach their largest here."""
    k = 512
    weight = _weight(24, k, seed=4, type_name=type_name)
    size = _FILE_BLOCK[type_name][1]
    raw = weight.data.clone().reshape(24, -1, size)
    for start, end in CODE_BYTES[type_name]:
        raw[:, :, start:end] = 0xFF
    if type_name == "Q8_0":
        raw[1::2, :, 2:34] = 0x80  # -128
        raw[2::4, :, 2:34] = 0x7F  # 127
    weight = FileBlocks(type_name, raw.reshape(24, -1), (24, k))
    product = Blocks(ops, [weight], None, out_float=True)
    x = torch.ones(4, k)
    x[1] = -1
    x[2, ::2] = -1  # the signs alternate, so that the pairs of products differ in sign
    x[3, 1::4] = -1
    paths = _paths(ops)
    results = {path: _call(ops, path, product, x) for path in paths}
    for path in paths:
        assert torch.equal(results[path], results["portable"]), path
        assert torch.equal(_call(ops, path, product, x[1:2]), results[path][1:2]), path
    ref = reference(x, [weight])
    assert torch.allclose(results["portable"].double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_inputs_halfway_between_two_codes_round_to_even_on_every_path(ops, dtype):
    """Each path's quantization of the inputs rounds an input halfway between two codes to the even one, as the
    loop does: blocks whose largest input is 127 (a scale of exactly 1), the others at +-k.5."""
    k = 64
    weight = _weight(16, k, seed=5, type_name="Q8_0")
    product = Blocks(ops, [weight], None, out_float=True)
    halves = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5])
    x = torch.zeros(3, k)
    x[:, 0] = 127
    x[:, 32] = -127
    x[0, 1:32] = halves.repeat(4)[:31]
    x[1, 33:64] = -halves.repeat(4)[:31]
    x[2, 1:64:2] = halves.repeat(4)
    x = x.to(dtype)
    paths = _paths(ops)
    results = {path: _call(ops, path, product, x) for path in paths}
    for path in paths:
        assert torch.equal(results[path], results["portable"]), path
    ref = reference(x, [weight])  # numpy's rint: half to even
    assert torch.allclose(results["portable"].double(), ref, rtol=1e-6, atol=1e-6 * ref.abs().max())


def test_fuzzed_shapes_formats_and_rows(ops):
    gen = torch.Generator().manual_seed(3)
    paths = _paths(ops)
    for trial in range(12):
        k = 256 * int(torch.randint(1, 6, (1,), generator=gen)) if trial % 3 == 0 else 32 * int(torch.randint(1, 40, (1,), generator=gen))
        formats = sorted(BLOCK_FORMATS) if k % 256 == 0 else sorted(set(BLOCK_FORMATS) - set(K_QUANTS))
        count = int(torch.randint(1, 4, (1,), generator=gen))
        kinds = [formats[int(i)] for i in torch.randint(0, len(formats), (count,), generator=gen)]
        parts = [_weight(int(torch.randint(1, 70, (1,), generator=gen)), k, seed=100 + trial * 4 + i, type_name=t)
                 for i, t in enumerate(kinds)]
        bias = torch.randn(sum(p.shape[0] for p in parts), generator=gen) if trial % 2 else None
        product = Blocks(ops, parts, bias)
        rows = int(torch.randint(1, 41, (1,), generator=gen))
        x = (torch.randn(rows, k, generator=gen) * float(torch.rand(1, generator=gen) * 10)).bfloat16()
        ref = reference(x, parts, bias)
        first = None
        for path in paths:
            y = _call(ops, path, product, x)
            assert y.dtype == torch.bfloat16 and y.shape == ref.shape
            first = y if first is None else first
            assert torch.equal(y, first), (trial, path)
            one = _call(ops, path, product, x[rows - 1 :])
            assert torch.equal(one[0], y[-1]), (trial, path)
        tol = 2 ** -7 * ref.abs() + 1e-3 * ref.abs().max() + 1e-6  # bf16 output
        assert ((first.double() - ref).abs() <= tol).all(), trial


def test_stacked_parts_are_the_parts_side_by_side(ops):
    parts = [_weight(40, 256, 7, "Q4_0"), _weight(24, 256, 8, "Q8_0"), _weight(33, 256, 9, "Q4_1"),
             _weight(16, 256, 10, "Q4_K"), _weight(20, 256, 11, "Q6_K")]
    bias = torch.randn(sum(p.shape[0] for p in parts))
    x = torch.randn(9, 256).bfloat16()
    whole = Blocks(ops, parts, bias, out_float=True)(x)
    split, at = [], 0
    for p in parts:
        split.append(Blocks(ops, [p], bias[at : at + p.shape[0]], out_float=True)(x))
        at += p.shape[0]
    assert torch.equal(whole, torch.cat(split, dim=1))


def test_bad_inputs_are_refused_with_a_reason(ops):
    weight = _weight(16, 64, 1, "Q4_1")
    product = Blocks(ops, [weight], None)
    with pytest.raises(RuntimeError, match="not a multiple of 32"):
        ops.blocks_mm(torch.randn(2, 48), product.packed, torch.tensor([[3, 16, 0]]), None, False)
    with pytest.raises(RuntimeError, match="past the packed weight"):
        ops.blocks_mm(torch.randn(2, 128), product.packed, product.parts, None, False)
    with pytest.raises(RuntimeError, match="unknown block format"):
        ops.blocks_pack(weight.data, 10)  # Q2_K
    with pytest.raises(RuntimeError, match="unknown kernel path"):
        ops.blocks_path(9)
    with pytest.raises(RuntimeError, match="not a multiple of 256"):
        ops.blocks_mm(torch.randn(2, 96), product.packed, torch.tensor([[12, 16, 0]]), None, False)
    with pytest.raises(ValueError, match="Q6_K over one input size"):
        Blocks(ops, [_weight(16, 64, 1, "Q4_1"), _weight(16, 96, 1, "Q4_1")], None)
    with pytest.raises(ValueError, match="do not hold a weight"):
        FileBlocks("Q4_1", weight.data[:, :-1], weight.shape)


def test_the_source_builds_for_a_cpu_without_avx2_or_avx512(tmp_path):
    """The library is built with -march=native; on a CPU without AVX-512 (or AVX2) the vector paths must
    still compile (each carries its own target attribute) and simply not be chosen, and off x86 (ARM;
    SPECULA_NO_X86 stands in for it here) the portable path alone. Both builds run side by side."""
    import shutil
    import subprocess

    from torch.utils.cpp_extension import include_paths

    cxx = compiled._compiler()
    if cxx is None or shutil.which(cxx) is None:
        pytest.skip("no C++ compiler")
    builds = []
    for n, flags in enumerate((["-march=x86-64"], ["-march=x86-64", "-DSPECULA_NO_X86"])):
        command = [cxx, "-O0", *flags, "-std=c++20", "-fopenmp", "-fPIC", "-c",
                   *(f"-I{p}" for p in include_paths()), str(compiled.SOURCE), "-o", str(tmp_path / f"step{n}.o")]
        builds.append((flags, subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    for flags, build in builds:
        _, errors = build.communicate(timeout=600)
        assert build.returncode == 0, (flags, errors[-2000:])


def test_the_table_of_formats_is_the_compiled_steps_and_the_gguf_packages(ops):
    """cpu/products.py's BLOCK_TABLE is the one list of the formats the own products run: each format's number, block
    weights and bytes are those blocks.h packs and the gguf package reads; a number outside it is no format there."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from specula.engine.cpu.products import BLOCK_TABLE

    assert [f.name for f in BLOCK_TABLE] == list(BLOCK_FORMATS)
    for f in BLOCK_TABLE:
        assert GGMLQuantizationType[f.name].value == f.ggml_type, f.name
        assert GGML_QUANT_SIZES[GGMLQuantizationType[f.name]] == (f.inputs, f.bytes), f.name
        assert list(ops.blocks_file_layout(f.ggml_type)) == [1, f.inputs, f.bytes], f.name
    for other in (0, 1, 9, 10, 11, 15, 30):  # F32, F16, Q8_1, Q2_K, Q3_K, Q8_K, BF16: not block formats there
        assert ops.blocks_file_layout(other)[0] == 0, other
