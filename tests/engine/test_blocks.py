"""The compiled step's own products over a file's blocks (engine/cpu/native/blocks.h, `Blocks`): every
format, code path and row count gives a row the bits it gets alone, every path gives the same bits, and
the result is the plain block arithmetic (activations quantized per block of 32, exact integer sums)."""

import numpy as np
import pytest
import torch

from specula.engine.cpu import step as compiled
from specula.engine.cpu.products import BLOCK_FORMATS, Blocks, FileBlocks

PATHS = {"portable": 1, "avx2": 2, "avx512": 3, "amx": 4}


@pytest.fixture(scope="module")
def ops():
    compiled.prepare(wait=True)
    if compiled.ops() is None:
        pytest.skip(f"the compiled step cannot be built here: {compiled.error()}")
    return compiled.ops()


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


def _call(ops, path: str, product: Blocks, x: torch.Tensor) -> torch.Tensor:
    ops.blocks_path(PATHS[path])
    try:
        return product(x)
    finally:
        ops.blocks_path(0)


def _weight(out: int, inp: int, seed: int, type_name: str) -> FileBlocks:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=gen) * 0.05
    w[:, :32] *= 40  # blocks of very different scales
    if out > 3:
        w[3] = 0  # a column of zero blocks
    return FileBlocks.quantize(w, type_name)


def reference(x: torch.Tensor, parts: list[FileBlocks], bias: torch.Tensor | None = None) -> torch.Tensor:
    """The block arithmetic written plainly in float64: x quantized per block of 32 as the kernels do,
    integer sums, each block's contribution scaled and added in order."""
    x = x.float().numpy()
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32)
    amax = np.abs(xb).max(-1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.rint(xb * inv[..., None]).astype(np.int64)  # round half to even, as the kernels
    outs = []
    for p in parts:
        raw = p.data.numpy().reshape(p.shape[0], k // 32, -1)
        scale = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float64)  # (out, blocks)
        if p.type_name == "Q8_0":
            codes, off = raw[..., 2:].view(np.int8).astype(np.int64), 0
        else:
            nib = raw[..., 4:] if p.type_name == "Q4_1" else raw[..., 2:]
            codes = np.concatenate([nib & 15, nib >> 4], axis=-1).astype(np.int64)
            off = 8 if p.type_name == "Q4_0" else 0
        v = np.einsum("obj,rbj->rob", codes - off, q)  # (rows, out, blocks) exact
        y = (v * scale[None] * d[:, None, :].astype(np.float64)).sum(-1)
        if p.type_name == "Q4_1":
            m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
            y += (m[None] * (d * q.sum(-1))[:, None, :]).sum(-1)
        outs.append(y)
    y = np.concatenate(outs, axis=1)
    if bias is not None:
        y += bias.float().numpy()
    return torch.from_numpy(y)


@pytest.mark.parametrize("type_name", sorted(BLOCK_FORMATS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_path_and_row_count_gives_a_row_its_own_bits(ops, type_name, dtype):
    weight = _weight(200, 576, seed=1, type_name=type_name)  # 200 columns: a part-filled last tile
    product = Blocks(ops, [weight], None, out_float=True)
    x = (torch.randn(32, 576, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
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
    dense = x.float() @ weight.dequantize().T  # the activations' int8 rounding: about 1 part in 200
    assert ((results["portable"] - dense).norm() / dense.norm()) < 0.02


def test_fuzzed_shapes_formats_and_rows(ops):
    gen = torch.Generator().manual_seed(3)
    paths = _paths(ops)
    for trial in range(12):
        k = 32 * int(torch.randint(1, 40, (1,), generator=gen))
        kinds = [sorted(BLOCK_FORMATS)[int(i)] for i in torch.randint(0, 3, (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen)]
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
    parts = [_weight(40, 128, 7, "Q4_0"), _weight(24, 128, 8, "Q8_0"), _weight(33, 128, 9, "Q4_1")]
    bias = torch.randn(97)
    x = torch.randn(9, 128).bfloat16()
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
        ops.blocks_pack(weight.data, 12)
    with pytest.raises(RuntimeError, match="unknown kernel path"):
        ops.blocks_path(9)
    with pytest.raises(ValueError, match="Q4_0, Q4_1 or Q8_0"):
        Blocks(ops, [_weight(16, 64, 1, "Q4_1"), _weight(16, 96, 1, "Q4_1")], None)
    with pytest.raises(ValueError, match="do not hold a weight"):
        FileBlocks("Q4_1", weight.data[:, :-1], weight.shape)
