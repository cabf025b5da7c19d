"""Native 4-bit weights: GGUF's Q4 blocks read exactly, run by the int4 kernel, and speculation over
them still lossless; every product form gives a row the same bits whatever rows share its call."""

import numpy as np
import pytest
import torch

from specula.engine.api.errors import SpeculaError
from specula.engine.cpu.products import Dense, Int4, can_prepack, in_rows, q4_from_gguf, q4_quantize, stable_rows_of
from specula.engine.drafters import DRAFTERS
from specula.engine.models.from_gguf import llama_row_order
from tests.support.tiny import assert_greedy_identity, head_options, native, perturbed, tiny_model


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_q4_blocks_give_exactly_ggufs_own_dequantized_weights(type_name):
    from gguf import GGMLQuantizationType, dequantize, quantize

    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(0)) * 0.05
    raw = quantize(weight.numpy(), GGMLQuantizationType[type_name])
    blocks = q4_from_gguf(raw, type_name, (48, 96))
    reference = torch.from_numpy(dequantize(raw, GGMLQuantizationType[type_name]).reshape(48, 96))
    assert torch.equal(blocks.dequantize(), reference)
    assert int(blocks.codes.max()) <= 15
    assert (blocks.dequantize() - weight).abs().max() < 0.05  # and they are a 4-bit copy of the weight


def _random_q4k(out: int, inp: int, seed: int) -> np.ndarray:
    """Well-formed Q4_K bytes: random nibbles and 6-bit scale bytes, small positive fp16 d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out, inp // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = rng.uniform(1e-4, 2e-3, (out, inp // 256, 1)).astype(np.float16).view(np.uint8)
    blocks[..., 2:4] = rng.uniform(1e-4, 2e-3, (out, inp // 256, 1)).astype(np.float16).view(np.uint8)
    return blocks.reshape(out, -1)


def test_q4_k_super_blocks_give_ggufs_own_dequantized_weights():
    from gguf import GGMLQuantizationType, dequantize

    from specula.engine.cpu.products import q4k_from_gguf

    raw = _random_q4k(32, 512, seed=0)
    blocks = q4k_from_gguf(raw, (32, 512))
    reference = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_K).reshape(32, 512))
    ours = blocks.dequantize()
    # (q - 8) * scale + zero against the reference's d * s * q - dmin * m: equal up to one fp32 rounding
    assert torch.allclose(ours, reference, rtol=2**-22, atol=1e-9)
    assert (ours == reference).float().mean() > 0.9
    assert blocks.scale.shape == (32, 16) and int(blocks.codes.max()) == 15
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    expected = x.float() @ blocks.dequantize(torch.bfloat16).t()
    assert (Int4(blocks, None, torch.bfloat16)(x).float() - expected).abs().max() < 0.02 * expected.abs().max()


def test_int4_product_computes_with_its_blocks_weights():
    weight = torch.randn(96, 64, generator=torch.Generator().manual_seed(1)) * 0.1
    blocks = q4_quantize(weight, "Q4_1")
    bias = torch.randn(96).to(torch.bfloat16)
    product = Int4(blocks, bias, torch.bfloat16)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    expected = x.float() @ blocks.dequantize(torch.bfloat16).t() + bias.float()
    assert (product(x).float() - expected).abs().max() < 0.05 * expected.abs().max()


def _product(form: str, inputs: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(3)
    weight = (torch.randn(160, inputs, generator=gen) * 0.05).to(dtype)
    if form == "int4":
        return Int4(q4_quantize(weight.float()), None, dtype)
    return Dense(weight, prepack=form == "prepacked")


# 1536 inputs: oneDNN sums them differently for a lone row than for several (an MLP down projection);
# fp32: F.linear's kernel gives a row other bits as the call's row count changes, the prepacked one not
@pytest.mark.parametrize("form,inputs,dtype", [
    ("dense", 96, torch.bfloat16), ("prepacked", 96, torch.bfloat16), ("int4", 96, torch.bfloat16),
    ("prepacked", 1536, torch.bfloat16), ("int4", 1536, torch.bfloat16), ("prepacked", 1536, torch.float32),
])
def test_a_row_gets_the_same_bits_whatever_the_other_rows(form, inputs, dtype):
    product = _product(form, inputs, dtype)
    product.stable_rows = stable_rows_of([product], dtype, torch.device("cpu"))
    assert product.stable_rows in (1, 2)  # 0 would mean no row count is stable: speculation could not be exact
    if form == "prepacked" and can_prepack(torch.empty(1, dtype=dtype)):
        assert product.kind == "prepacked"
    gen = torch.Generator().manual_seed(4)
    for trial in range(4):
        block = torch.randn(32, inputs, generator=gen).to(dtype)
        alone = torch.cat([in_rows(product, block[i : i + 1]) for i in range(32)])  # single steps' calls
        for rows in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32):  # verify passes
            assert torch.equal(in_rows(product, block[:rows]), alone[:rows]), (form, trial, rows)


def test_the_probe_finds_that_a_lone_row_needs_a_second_one_where_it_does():
    """A product whose lone row rounds apart (F.linear in fp32, on every CPU tried) is probed as needing
    two rows, and a product of two stable rows as needing one; in_rows pads only what needs it."""
    dense = _product("dense", 96, torch.float32)
    assert stable_rows_of([dense], torch.float32, torch.device("cpu")) in (0, 2)
    calls = []

    class Recorder:
        in_features, stable_rows = 4, 2

        def __call__(self, x):
            calls.append(x.shape[0])
            return x * 2

    x = torch.arange(4.0)[None]
    assert torch.equal(in_rows(Recorder(), x), x * 2) and calls == [2]
    in_rows(Recorder(), torch.ones(3, 4))
    assert calls == [2, 3]


def test_prompt_chunks_run_dense_and_verify_passes_never_do():
    from specula.engine.api.types import K_MAX
    from specula.engine.cpu.products import PROMPT_ROWS

    assert K_MAX + 1 < PROMPT_ROWS  # every verify pass meets the int4 kernel, as single steps do
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(6)) * 0.1
    blocks = q4_quantize(weight)
    dense_weight = blocks.dequantize().to(torch.bfloat16)
    product = Int4(blocks, None, torch.bfloat16, dense=Dense(dense_weight))
    x = torch.randn(PROMPT_ROWS, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    assert torch.equal(product(x), torch.nn.functional.linear(x, dense_weight))
    assert torch.equal(product(x[: PROMPT_ROWS - 1]), Int4(blocks, None, torch.bfloat16)(x[: PROMPT_ROWS - 1]))


def test_llama_row_order_undoes_llama_cpps_permutation():
    n_head, rows = 4, 32
    hf = torch.arange(rows)
    # what llama.cpp's converter does to q/k rows (interleave each head's two rotary halves)
    gguf = hf.reshape(n_head, 2, rows // n_head // 2).transpose(1, 2).reshape(-1)
    assert torch.equal(gguf[llama_row_order(rows, n_head)], hf)


def test_a_weight_the_int4_kernel_cannot_take_stays_dense(monkeypatch):
    import specula.engine.models.layers
    from specula.engine.cpu.products import int4_fits

    assert int4_fits((960, 576)) and not int4_fits((24, 576)) and not int4_fits((32, 48))
    monkeypatch.setattr(specula.engine.models.layers, "int4_fits", lambda shape: shape[0] != 128)  # as if q/k/v could not
    layer = native(tiny_model(vocab=64, layers=1, seed=3)).new_runner().layers[0]
    assert layer.qkv.kind != "int4" and layer.o_proj.kind == "int4"


def test_native_products_are_used_and_agree_with_the_dequantized_model():
    target = native(tiny_model(vocab=64, layers=4, seed=7))
    runner = target.new_runner()
    assert all(p.kind == "int4" for layer in runner.layers for p in layer.products)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(0))
    ours = runner.forward(ids, last=40)
    with torch.no_grad():
        ref = target.model(ids[None]).logits[0].float()  # transformers over the same (dequantized) weights
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert (ours - ref).abs().max() < 0.1 * ref.abs().max()


@pytest.mark.parametrize("strategy", sorted(set(DRAFTERS) - {"none"}))
def test_greedy_speculation_over_native_weights_is_identical_to_plain_decoding(strategy, tmp_path):
    target = native(tiny_model(vocab=64, layers=4, seed=7))
    draft = native(perturbed(tiny_model(vocab=64, layers=4, seed=7), scale=0.05))
    options = head_options(target, strategy, tmp_path)
    # prompts of 64 tokens or more are prefilled by the dense twins of the int4 products
    assert_greedy_identity(target, draft, strategy, options, trials=8, longest_prompt=130, max_new_tokens=60)


def test_native_weights_need_a_gguf(tiny_folder):
    from specula.engine.api.types import ModelChoice
    from specula.engine.models.loading import load_model

    with pytest.raises(SpeculaError, match="native weights need a GGUF file"):
        load_model(ModelChoice(str(tiny_folder), device="cpu", dtype="fp32", weights="native"))
    with pytest.raises(SpeculaError, match="unknown weights"):
        load_model(ModelChoice(str(tiny_folder), device="cpu", weights="int3"))
    assert load_model(ModelChoice(str(tiny_folder), device="cpu", dtype="bf16")).native is None  # auto: dense


@pytest.mark.e2e
def test_the_bundled_gguf_runs_natively_and_exactly(tmp_path, bundled_fp32):
    from specula.engine.api.types import ModelChoice
    from specula.engine.models.loading import load_model

    with pytest.raises(SpeculaError, match="compute in bf16"):
        load_model(ModelChoice("bundled", device="cpu", dtype="fp32", weights="native"))
    model = load_model(ModelChoice("bundled", device="cpu", dtype="bf16"))  # auto: native
    assert model.weights == "Q4_1 (native)"
    projections = [name for name in model.native.tensors if name != "lm_head"]
    assert len(projections) == 30 * 7
    assert model.native.tensors["lm_head"].type_name == "Q8_0"  # the tied embedding, as the file stores it
    # the blocks (llama.cpp's q/k row order undone by an index) give, in every layer, the weights that
    # transformers' own GGUF processing (its reverse permutation, in fp32) gives the dequantized load
    dense = dict(bundled_fp32.model.named_modules())
    for name in projections:
        assert torch.equal(model.native.tensors[name].dequantize(), dense[name].weight), name
    # nothing in the model is a dense copy of a projection or the head: their parameters have no memory; the
    # embedding, small, is a bf16 copy (looked up from the file's Q8_0 a step would cost more)
    assert all(p.is_meta for n, p in model.model.named_parameters() if n.endswith("proj.weight"))
    embed = model.model.get_input_embeddings()
    assert isinstance(embed, torch.nn.Embedding) and embed.weight.dtype == torch.bfloat16
    assert torch.equal(embed.weight, dense["model.embed_tokens"].weight.to(torch.bfloat16))
    from specula.engine.cli.export import export

    out = export("bundled", tmp_path / "export")  # what a serving engine gets: the model's weights only
    assert [f.name for f in out.glob("*.safetensors")] == ["model.safetensors"]
    assert (out / "tokenizer.json").is_file() and (out / "config.json").is_file()
    assert export("bundled", tmp_path / "export") == out  # the same source again: kept as it is
