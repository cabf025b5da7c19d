"""The compiled step's own products over bf16 weights (engine/cpu/native/tiles.h, `Tiles`): every code path
and row count gives a row the bits it gets alone, every path gives the same bits, the result is one fp32
sum per output over the inputs by pairs, and prompts take oneDNN's product."""

import numpy as np
import pytest
import torch

from specula.engine.cpu.products import PROMPT_ROWS, Dense, Tiles, can_prepack
from tests.engine.test_blocks import _call, _paths


def _weight(out: int, inp: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(out, inp, generator=gen) * 0.05
    w[:, :8] *= 40  # inputs of very different sizes
    if out > 3:
        w[3] = 0
    return w.bfloat16()


def _tiles(ops, w: torch.Tensor, bias: torch.Tensor | None = None, out_float: bool = False) -> Tiles:
    if not can_prepack(w):
        pytest.skip("oneDNN has no bf16 product on this CPU")
    return Tiles(ops, Dense(w, bias, prepack=True), out_float=out_float)


def reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> np.ndarray:
    """The arithmetic written plainly: per output, fp32 fused multiply-adds over the inputs by pairs, the
    odd input of a pair first, from 0 (numpy has no fma: each step in float64, where a product of two bf16
    values and its sum with an fp32 value are exact for these magnitudes, then rounded to fp32)."""
    xs, ws = x.float().double().numpy(), w.float().double().numpy()
    acc = np.zeros((xs.shape[0], ws.shape[0]), dtype=np.float32)
    for p in range(xs.shape[1] // 2):
        for j in (2 * p + 1, 2 * p):
            acc = (acc.astype(np.float64) + np.outer(xs[:, j], ws[:, j])).astype(np.float32)
    if bias is not None:
        acc = acc + bias.float().numpy()
    return acc


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_path_and_row_count_gives_a_row_its_own_bits(ops, dtype):
    """1 to 32 rows on every path this CPU has: each row equals that row alone, on the portable path too."""
    w = _weight(40, 96, seed=1)  # 40 outputs: a part tile
    bias = torch.randn(40).bfloat16()
    product = _tiles(ops, w, bias)
    x = (torch.randn(32, 96, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    alone = torch.cat([_call(ops, "portable", product, x[i : i + 1]) for i in range(32)])
    assert alone.dtype == dtype
    for path in _paths(ops):
        for rows in (1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 32):
            got = _call(ops, path, product, x[:rows])
            assert torch.equal(got, alone[:rows]), (path, rows)


def test_the_result_is_the_plain_arithmetic(ops):
    w = _weight(24, 64, seed=3)
    bias = torch.randn(24)
    product = _tiles(ops, w, bias, out_float=True)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    want = reference(x, w, bias)
    for path in _paths(ops):
        got = _call(ops, path, product, x)
        assert got.dtype == torch.float32
        assert np.array_equal(got.numpy(), want), path
    exact = x.double() @ w.double().T + bias.double()
    assert torch.allclose(got.double(), exact, rtol=1e-5, atol=1e-5)


def test_random_shapes_and_rows_agree_across_paths(ops):
    """Fuzz: shapes (part tiles, short and long inputs), row counts and biases; every path gives the bits of
    the portable one, and each row the bits it gets alone."""
    gen = torch.Generator().manual_seed(5)
    for trial in range(12):
        out = int(torch.randint(1, 70, (1,), generator=gen))
        inp = 2 * int(torch.randint(1, 200, (1,), generator=gen))
        rows = int(torch.randint(1, 33, (1,), generator=gen))
        bias = torch.randn(out, generator=gen).bfloat16() if trial % 2 else None
        product = _tiles(ops, _weight(out, inp, seed=100 + trial), bias)
        x = torch.randn(rows, inp, generator=gen).bfloat16()
        want = _call(ops, "portable", product, x)
        last = _call(ops, "portable", product, x[-1:])
        assert torch.equal(want[-1:], last), (out, inp, rows)
        for path in _paths(ops):
            assert torch.equal(_call(ops, path, product, x), want), (path, out, inp, rows)


def test_prompts_take_onednns_product(ops):
    w = _weight(48, 64, seed=6)
    product = _tiles(ops, w)
    dense, calls = product.dense, []
    product.dense = lambda x: calls.append(x.shape[0]) or dense(x)
    x = torch.randn(PROMPT_ROWS, 64).bfloat16()
    assert torch.equal(product(x), dense(x)) and calls == [PROMPT_ROWS]
    assert torch.equal(product(x[:-1]), ops.tiles_mm(x[:-1], product.packed, 48, None, False))
    assert calls == [PROMPT_ROWS]  # below it, the own products


def test_bad_inputs_get_one_line_reasons(ops):
    packed = ops.tiles_pack(torch.zeros(16, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="odd input size"):
        ops.tiles_pack(torch.zeros(16, 7, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="bf16"):
        ops.tiles_pack(torch.zeros(16, 8))
    with pytest.raises(RuntimeError, match="does not hold"):
        ops.tiles_mm(torch.zeros(1, 8, dtype=torch.bfloat16), packed, 17, None, False)
    with pytest.raises(RuntimeError, match="does not hold"):
        ops.tiles_mm(torch.zeros(1, 6, dtype=torch.bfloat16), packed, 16, None, False)
    with pytest.raises(RuntimeError, match="a bias per output"):
        ops.tiles_mm(torch.zeros(1, 8, dtype=torch.bfloat16), packed, 16, torch.zeros(3), False)
    with pytest.raises(ValueError, match="bf16"):
        Tiles(ops, Dense(torch.zeros(16, 8), None, prepack=False))
    # a bf16 weight kept as it is (a GGUF's): prompts take F.linear over it instead of oneDNN's prepacked copy
    plain = Tiles(ops, Dense(torch.ones(16, 8, dtype=torch.bfloat16), None, prepack=False))
    assert plain.kind == "tiles-plain" and torch.equal(plain(torch.ones(64, 8, dtype=torch.bfloat16)),
                                                       torch.full((64, 16), 8.0, dtype=torch.bfloat16))


@pytest.mark.parametrize("shape", [(16, 8), (37, 70), (48, 2 * 200), (130, 64)])
def test_tiles_alone_unpack_to_their_weight_and_prompts_get_f_linears_bits(ops, shape):
    """Tiles with no other copy (a GGUF's dense weights): the tiles unpack to the weight bit for bit, whatever its
    shape, and a prompt's call gives F.linear's bits over the weight (through the calling thread's scratch, used
    again by a smaller product after a larger one); below PROMPT_ROWS rows, the tiles' own arithmetic."""
    w = _weight(*shape, seed=shape[0])
    bias = torch.randn(shape[0]).bfloat16()
    alone = Tiles.alone(ops, [w[: shape[0] // 3].clone(), w[shape[0] // 3 :].clone()], bias)  # stacked: fused q/k/v
    assert alone.kind == "tiles-unpack" and alone.weight.shape == (shape[0], 0) and alone.dense is None
    assert torch.equal(ops.tiles_unpack(alone.packed, *shape), w) and torch.equal(alone.packed, ops.tiles_pack(w))
    big = Tiles.alone(ops, [_weight(300, shape[1], seed=1)], None)
    x = torch.randn(PROMPT_ROWS + 5, shape[1]).bfloat16()
    big(x)  # the scratch grows to the larger weight; the smaller one reads only its part of it
    assert torch.equal(alone(x), torch.nn.functional.linear(x, w, bias))
    one = x[:3]
    assert torch.equal(alone(one), ops.tiles_mm(one, alone.packed, shape[0], bias, False))
    with pytest.raises(RuntimeError, match="does not hold"):
        ops.tiles_linear(torch.zeros(PROMPT_ROWS, shape[1] + 2, dtype=torch.bfloat16), alone.packed, shape[0], None)
