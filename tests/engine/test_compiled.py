"""The compiled decoding step (engine/cpu/step.py, engine/cpu/native/step.cpp): it computes the model's
forward, a position gets the same bits alone and in a verify pass (and a tree node the chain's), every
strategy's greedy answers are plain decoding's, and without a compiler everything stays eager."""

import dataclasses

import pytest
import torch

from specula.engine.cpu import products
from specula.engine.cpu import step as compiled
from specula.engine.decoding.tree import TokenTree
from specula.engine.drafters import DRAFTERS
from specula.engine.models import compiled as compiled_passes
from specula.engine.models import runner as lean_runner
from specula.engine.models.compiled import step_rows
from specula.engine.models.loading import LoadedModel
from tests.support.tiny import assert_greedy_identity, head_options, native, perturbed, tiny_model


def _with_step(model: LoadedModel, step: str = "compiled") -> LoadedModel:
    model.step = step
    return model


@pytest.mark.parametrize("family", ["llama", "qwen3", "smollm3", "gemma3", "phi3", "mistral", "ministral", "granite",
                                    "olmo2", "gemma2", "exaone4"])
@pytest.mark.parametrize("step", ["compiled", "eager"])
def test_the_lean_forward_is_the_models_forward_in_fp32(ops, family, step):
    """The compiled step and the eager lean forward against transformers' own forward in fp32: norms (Qwen3's
    per-head norms of queries and keys too), rotary (none on SmolLM3's every fourth layer), grouped-query
    attention, SiLU; Gemma 3's norms of 1 + w, four a layer, scaled embeddings, GELU-tanh, and its local layers'
    window of 8 positions (the context runs to 40) with their own rotary base; Phi-3's fused weights, its rotary over
    3/4 of each head with longrope's short factors, its window over every layer; Mistral's window over every layer and
    Ministral's over every other one; Granite's multipliers; OLMo 2's norms of the outputs only and q/k norms over all
    heads; EXAONE 4's norms of the outputs, per-head q/k norms and global layers without rotary."""
    model = tiny_model(vocab=64, layers=4, seed=4, family=family)  # 4 query heads over 2 KV heads
    target = _with_step(LoadedModel(model, None, "tiny", torch.device("cpu"), torch.float32), step)
    assert target.uses_lean_forward
    runner = target.new_runner()
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(0))
    runner.forward(ids[:1])  # a one-token prompt starts the answer in the compiled mode
    assert runner.compiled == (step == "compiled")
    ours = [runner.forward(ids[1:20], last=19)]  # one pass of 19 rows, then single steps
    ours += [runner.forward(ids[i : i + 1]) for i in range(20, 40)]
    ours = torch.cat(ours)
    with torch.no_grad():
        ref = model(ids[None]).logits[0, 1:].float()
    assert torch.allclose(ours, ref, atol=1e-4, rtol=1e-4), (ours - ref).abs().max()


@pytest.mark.parametrize("form", ["fp32", "bf16", "native"])
def test_a_models_biases_go_through_every_product_form_of_the_compiled_step(ops, form):
    """A Qwen2 model's q/k/v biases (random, not the zeros a new model has) through the compiled step's products: F.linear
    in fp32, the own bf16 tiles, the file's blocks; its logits are the eager forward's of the same weights (to the
    rounding of bf16 activations, and of int8 ones in the blocks' products)."""
    model = tiny_model(vocab=64, layers=3, seed=4, family="qwen2")
    with torch.no_grad():
        biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
        for p in biases:
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.5)
    assert biases
    if form == "native":
        target = native(model)
    else:
        dtype = torch.float32 if form == "fp32" else torch.bfloat16
        target = LoadedModel(model.to(dtype), None, "tiny", torch.device("cpu"), dtype)
    ids = torch.randint(0, 64, (30,), generator=torch.Generator().manual_seed(0))
    logits = {}
    for step in ("compiled", "eager"):
        runner = _with_step(target, step).new_runner()
        runner.forward(ids[:1])
        passes = [runner.forward(ids[1:12], last=11)] + [runner.forward(ids[i : i + 1]) for i in range(12, 30)]
        assert runner.compiled == (step == "compiled")
        logits[step] = torch.cat(passes)
    tol = 1e-4 if form == "fp32" else 0.1
    assert torch.allclose(logits["compiled"], logits["eager"], atol=tol, rtol=0), (logits["compiled"] - logits["eager"]).abs().max()


@pytest.mark.parametrize("act", ["silu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_activation_in_vectors_gives_every_element_the_bits_of_the_loop(ops, dtype, act):
    """The step's silu(gate) * up (and Gemma's GELU-tanh), 8 elements at a time (AVX2) against one at a time, bit for
    bit: ordinary values, the exponent's clamps, zeros, infinities, NaN, subnormals; rows shared between threads and a
    row whose length leaves a remainder for the loop. And both near the activation's definition."""
    mul = ops.silu_mul if act == "silu" else ops.gelu_mul
    gen = torch.Generator().manual_seed(7)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 87.0, -87.0, 88.0, -88.0, 86.99, -87.01,
                            88.5, -120.0, 1e-40, -1e-40, 1e30, -1e30, 0.5, -0.5, 3.0])
    for rows, inter in [(3, 1536), (1, 1536), (2, 37), (5, 300)]:
        gate = torch.randn(rows, inter, generator=gen) * 6
        gate.view(-1)[: inter // 2] = torch.rand(inter // 2, generator=gen) * 200 - 100  # past both clamps
        gate.view(-1)[-len(special):] = special  # the last row's tail: vectors and, for 37, the loop's remainder
        up = torch.randn(rows, inter, generator=gen) * 3
        up.view(-1)[:4] = torch.tensor([float("inf"), float("nan"), -0.0, 1e-39])
        gu = torch.cat([gate, up], dim=1).to(dtype)
        fast, loop = mul(gu, True), mul(gu, False)
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        both_nan = fast.isnan() & loop.isnan()
        assert torch.equal(fast.isnan(), loop.isnan()), (rows, inter)
        assert torch.equal(fast.view(bits)[~both_nan], loop.view(bits)[~both_nan]), (rows, inter)
        if dtype == torch.bfloat16:
            assert torch.all(fast.view(torch.int16)[both_nan] == 0x7FC0)  # bf16's one NaN, as c10 rounds it
        g, u = gu[:, :inter].double(), gu[:, inter:].double()
        # GELU-tanh as g * sigmoid(2y): 0.5 g (1 + tanh(y)) without the cancellation where tanh nears -1
        want = g * torch.sigmoid(g if act == "silu" else 2 * 0.7978845608028654 * (g + 0.044715 * g**3)) * u
        finite = want.isfinite() & (g.abs() < 80)
        tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
        assert torch.allclose(fast.double()[finite], want[finite], rtol=tol, atol=1e-30), (rows, inter)


@pytest.mark.parametrize("form,c", [("native", 40), ("mixed blocks", 40), ("bf16", 40), ("native", 301), ("fp32", 301),
                                    ("fp32, heads of 64", 301), ("qwen3 bf16", 40), ("qwen3 native", 301),
                                    ("smollm3 native", 40), ("gemma3 bf16", 40), ("gemma3 native", 301),
                                    ("gemma3 fp32", 5), ("gemma3 native, heads of 256", 301), ("phi3 bf16", 40),
                                    ("phi3 native", 301), ("ministral native", 301), ("granite bf16", 40),
                                    ("olmo2 native", 40), ("gemma2 native", 301)])
def test_a_position_gets_the_same_bits_alone_in_a_pass_and_in_a_tree(ops, form, c):
    """c: the context before the pass; 301 spans several blocks of keys scored together and several chunks of
    values summed together, with an odd number of keys before the pass's rows (the sums take keys by rank).
    Heads of 64 dimensions (the bundled model's) are summed in several slices by the AVX2 path. Gemma 3's local
    layers see 8 positions: past the window a row's keys are gathered as a tree row's; from c = 5 a pass's rows
    straddle the window's first cut."""
    family = form.split()[0] if form.startswith(("qwen3", "smollm3", "gemma3", "phi3", "ministral", "granite", "olmo2", "gemma2")) else "llama"
    model = tiny_model(vocab=64, layers=4 if family == "smollm3" else 3, seed=6, family=family,
                       head_dim=64 if "64" in form else 256 if "256" in form else 16)
    form = form.removeprefix(f"{family} ")
    if form == "native":
        target = native(model)
    elif form == "mixed blocks":  # fused parts of several formats, and the LM head in Q8_0
        target = native(model, formats=("Q4_1", "Q8_0", "Q4_0"), head="Q8_0")
    else:  # dense weights: the attention's last bits reach the logits (int8 or bf16 activations round them off)
        dtype = torch.float32 if form.startswith("fp32") else torch.bfloat16
        target = LoadedModel(model.to(dtype), None, "tiny", torch.device("cpu"), dtype)
    target = _with_step(target)
    ids = torch.randint(0, 64, (c + 20,), generator=torch.Generator().manual_seed(1))
    runner = target.new_runner()
    runner.forward(ids[:1])
    runner.forward(ids[1:c], last=c - 1)  # a context to attend over
    alone = torch.cat([runner.forward(ids[i : i + 1]) for i in range(c, c + 9)])
    for rows in (2, 5, 9):
        runner.truncate(c)
        assert torch.equal(runner.forward(ids[c : c + rows], last=rows), alone[:rows]), rows
    # a tree: rows 1 and 2 continue row 0 side by side, row 3 continues row 2; the path 0-2-3 is the chain
    runner.truncate(c)
    branch = torch.tensor([int(ids[c]), 7, int(ids[c + 1]), int(ids[c + 2])])
    tree = runner.forward(branch, last=4, tree=TokenTree((-1, 0, 0, 2)))
    assert runner.compiled
    assert torch.equal(tree[[0, 2, 3]], alone[:3])
    runner.keep(c, [0, 2, 3])
    assert torch.equal(runner.forward(ids[c + 3 : c + 4]), alone[3:4])  # the kept path's cache is the chain's
    # a kept path of the first rows (nothing moves) and a longer step after it
    runner.truncate(c)
    runner.forward(torch.tensor([int(ids[c]), int(ids[c + 1]), 9]), last=3, tree=TokenTree((-1, 0, 0)))
    runner.keep(c, [0, 1])
    assert torch.equal(runner.forward(ids[c + 2 : c + 5], last=3), alone[2:5])


@pytest.mark.parametrize("head_dim", [16, 64])
def test_single_steps_read_a_bf16_models_values_from_a_bf16_copy_with_the_same_bits(ops, head_dim):
    """A bf16 model's values are bf16 numbers: the compiled step keeps a bf16 copy of them for single steps (half
    the bytes), kept in step with the fp32 cache through prompts, passes, trees, a kept path, single and batched
    steps and a cache that grows, and every logit is the one the fp32 values give (heads of 16 and 64 dimensions
    take different vector paths)."""
    model = tiny_model(vocab=64, layers=3, seed=11, head_dim=head_dim)
    target = _with_step(LoadedModel(model.to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16))
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (37, 300)]
    follow = torch.randint(0, 64, (len(prompts), 8), generator=gen)

    def run(narrow):
        runners, out = [], []
        for prompt, more in zip(prompts, follow):
            runner = target.new_runner()
            runner.cache.shape = dataclasses.replace(runner.cache.shape, narrow_values=narrow)
            out.append(runner.forward(prompt[:1]))
            out.append(runner.forward(prompt[1:], last=prompt.shape[0] - 1))
            out += [runner.forward(more[i : i + 1]) for i in range(3)]
            out.append(runner.forward(more[3:6], last=3))  # a pass of 3 rows
            out.append(runner.forward(more[:4], last=4, tree=TokenTree((-1, 0, 0, 2))))
            runner.keep(runner.length - 4, [0, 2, 3])
            out.append(runner.forward(more[6:7]))  # a single step over the kept path's moved slots
            assert runner.compiled and runner.cache.vn.dtype == torch.bfloat16
            assert runner.cache.vn.numel() == (runner.cache.v.numel() if narrow else 0)
            runners.append(runner)
        out += [step_rows(runners, follow[:, i]) for i in range(2)]
        if narrow:  # the copy holds the cache's values, bit for bit
            for r in runners:
                assert torch.equal(r.cache.vn[:, :, : r.length].float(), r.cache.v[:, :, : r.length])
        return torch.cat(out)

    assert target.new_runner().cache.shape.narrow_values
    assert torch.equal(run(True), run(False))


@pytest.mark.parametrize("form", ["native", "fp32"])
def test_a_prompt_read_in_chunks_gives_each_position_the_bits_of_single_steps(ops, form, monkeypatch):
    """A prompt through the compiled step (where its products are the file's blocks) runs as passes of STEP_CHUNK rows
    from an empty cache, a long second turn too: every position's logits and hidden states are those of single
    steps, whatever rows the caller keeps; in fp32 they are the model's forward."""
    monkeypatch.setattr(compiled_passes, "STEP_CHUNK", 7)
    monkeypatch.setattr(lean_runner, "prompt_through_step", lambda fast, dtype: True)
    model = tiny_model(vocab=64, layers=3, seed=5)
    if form == "native":
        target = _with_step(native(model))
    else:
        target = _with_step(LoadedModel(model, None, "tiny", torch.device("cpu"), torch.float32))
    ids = torch.randint(0, 64, (45,), generator=torch.Generator().manual_seed(3))
    alone = target.new_runner()
    singles = torch.cat([alone.forward(ids[i : i + 1]) for i in range(45)])
    chunked = target.new_runner()
    whole = chunked.forward(ids[:30], last=30)  # five passes of 7 rows and one of 2
    assert chunked.compiled and chunked.length == 30
    assert torch.equal(whole, singles[:30])
    assert torch.equal(chunked.forward(ids[30:45], last=4), singles[41:45])  # a second turn, the last 4 rows kept
    assert torch.equal(chunked.features(0, 45), alone.features(0, 45))
    for last in (1, 7, 8, 9):  # rows kept across a chunk's edge
        chunked.truncate(0)
        assert torch.equal(chunked.forward(ids[:30], last=last), singles[30 - last : 30]), last
    if form == "fp32":
        with torch.no_grad():
            ref = model(ids[None]).logits[0].float()
        assert torch.allclose(whole, ref[:30], atol=1e-4, rtol=1e-4), (whole - ref[:30]).abs().max()


def test_prompts_run_through_the_step_where_its_products_are_the_files_blocks(ops, monkeypatch):
    """The file's blocks in bf16, with oneDNN's bf16 kernels or without (AVX2): through the compiled step; dense
    weights (torch's products either way) or fp32: the eager forward."""
    model = tiny_model(vocab=64, layers=2, seed=6)
    blocks = _with_step(native(model))
    dense = _with_step(LoadedModel(tiny_model(vocab=64, layers=2, seed=6).to(torch.bfloat16), None, "tiny",
                                   torch.device("cpu"), torch.bfloat16))
    fp32 = _with_step(LoadedModel(tiny_model(vocab=64, layers=2, seed=6), None, "tiny", torch.device("cpu"), torch.float32))
    chosen = {}
    # oneDNN's bf16 kernels can be switched off where the CPU has them, not on where it has not (its prepacking
    # refuses bf16 weights on an AVX2-only CPU)
    kinds = (True, False) if products.dense_bf16_kernels() else (False,)
    for fast_bf16 in kinds:
        monkeypatch.setattr(products, "dense_bf16_kernels", lambda fast_bf16=fast_bf16: fast_bf16)
        for name, target in (("blocks", blocks), ("dense", dense), ("fp32", fp32)):
            runner = target.new_runner()
            runner.forward(torch.tensor([1]))  # the answer's mode and products
            assert runner.compiled
            chosen[name, fast_bf16] = compiled_passes.prompt_through_step(runner.fast, runner.dtype)
    expected = {("blocks", True): True, ("dense", True): False, ("fp32", True): False,
                ("blocks", False): True, ("dense", False): False, ("fp32", False): False}
    assert chosen == {key: value for key, value in expected.items() if key[1] in kinds}


def test_the_compiled_step_runs_the_files_blocks_and_the_eager_one_torchs(ops):
    target = _with_step(native(tiny_model(vocab=64, layers=2, seed=6), formats=("Q4_1", "Q8_0", "Q4_0"), head="Q8_0"))
    runner = target.new_runner()
    runner.forward(torch.tensor([1]))
    assert runner.compiled and runner.fast.lm_head is not None
    assert runner.fast.lm_head.source_type == "Q8_0"
    assert runner.fast.kinds == ["blocks"] * 8  # every product of the compiled step
    kinds = {p.kind for layer in runner.layers for p in layer.products}  # the eager forward's: torch's
    assert "int4" in kinds and kinds <= {"int4", "prepacked", "dense"}


@pytest.mark.parametrize("form", ["native", "mixed blocks", "bf16"])
def test_a_batched_step_gives_each_answer_the_bits_of_its_own_steps(ops, form):
    """step_rows (batched plain decoding, for training data): rows at other positions, in caches of other
    sizes, one of them grown mid-way, each get the logits their own single steps give, and (kept for an EAGLE-3
    head's training) the hidden states entering the layers kept."""
    model = tiny_model(vocab=64, layers=3, seed=9)
    if form == "native":
        target = native(model)
    elif form == "mixed blocks":
        target = native(model, formats=("Q4_1", "Q8_0", "Q4_0"), head="Q8_0")
    else:
        target = LoadedModel(model.to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16)
    target = _with_step(target)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 64, (n,), generator=gen) for n in (1, 7, 30, 250)]
    steps = torch.randint(0, 64, (len(prompts), 12), generator=gen)
    layers = (0, 2) if form == "native" else ()
    alone, alone_aux = [], []
    for prompt, follow in zip(prompts, steps):
        runner = target.new_runner()
        runner.keep_layers(layers)
        runner.forward(prompt)
        alone.append(torch.cat([runner.forward(follow[i : i + 1]) for i in range(follow.shape[0])]))
        alone_aux.append(runner.aux_features(0, runner.length) if layers else None)
    runners = [target.new_runner() for _ in prompts]
    for runner, prompt in zip(runners, prompts):
        runner.keep_layers(layers)
        runner.forward(prompt)
    together = torch.stack([step_rows(runners, steps[:, i]) for i in range(steps.shape[1])], dim=1)
    for b in range(len(prompts)):
        assert torch.equal(together[b], alone[b]), b
        if layers:
            assert torch.equal(runners[b].aux_features(0, runners[b].length), alone_aux[b]), b
    assert all(r.length == p.shape[0] + steps.shape[1] for r, p in zip(runners, prompts))
    assert runners[3].cache.k.shape[2] > 256  # the longest one's cache grew during the batched steps
    with pytest.raises(ValueError, match="one token per runner"):
        step_rows(runners, steps[:2, 0])
    eager = _with_step(target, "eager").new_runner()
    eager.forward(prompts[1])
    with pytest.raises(ValueError, match="compiled step"):
        step_rows(runners[:1] + [eager], steps[:2, 0])


@pytest.mark.parametrize("strategy", sorted(set(DRAFTERS) - {"none"}))
def test_greedy_speculation_through_the_compiled_step_is_plain_decoding(ops, strategy, tmp_path):
    target = _with_step(native(tiny_model(vocab=64, layers=4, seed=7), formats=("Q4_1", "Q4_0", "Q8_0"), head="Q8_0"))
    draft = _with_step(native(perturbed(tiny_model(vocab=64, layers=4, seed=7), scale=0.05)))
    options = head_options(target, strategy, tmp_path)
    assert_greedy_identity(target, draft, strategy, options, trials=4, longest_prompt=40, max_new_tokens=48)
    runner = target.new_runner()
    runner.forward(torch.tensor([1, 2, 3]))
    runner.forward(torch.tensor([4]))
    assert runner.compiled  # the answers above ran through it


@pytest.mark.parametrize("family,strategy", [("qwen3", "prompt-lookup"), ("qwen3", "eagle"), ("smollm3", "prompt-lookup"),
                                             ("gemma3", "prompt-lookup"), ("gemma3", "eagle"), ("phi3", "prompt-lookup"),
                                             ("granite", "prompt-lookup"), ("olmo2", "prompt-lookup"), ("exaone4", "prompt-lookup"),
                                             ("gemma2", "prompt-lookup")])
def test_qwen3_smollm3_and_gemma3_run_through_the_compiled_step_and_speculation_is_plain_decoding(ops, family, strategy,
                                                                                                tmp_path):
    """Qwen3's per-head norms of the queries and keys, SmolLM3's layers without rotary and Gemma 3's layers run in the
    compiled step (Qwen3 once fell back to the eager forward without a word, SmolLM3 and Gemma 3 to transformers'
    forward): the step is taken, and speculation over it keeps plain decoding's answer."""
    target = _with_step(native(tiny_model(vocab=64, layers=4, seed=9, family=family), formats=("Q4_0", "Q8_0")))
    runner = target.new_runner()
    runner.forward(torch.tensor([1, 2, 3]))
    runner.forward(torch.tensor([4]))
    assert runner.compiled
    assert_greedy_identity(target, None, strategy, head_options(target, strategy, tmp_path), trials=3, longest_prompt=40,
                           max_new_tokens=40)


def test_the_mode_is_chosen_per_answer_and_eager_stays_eager(ops):
    model = native(tiny_model(vocab=64, layers=2, seed=8))
    ids = torch.tensor([5, 6, 7, 8])
    eager = _with_step(model, "eager").new_runner()
    eager.forward(ids[:3])
    eager.forward(ids[3:])
    assert not eager.compiled
    auto = _with_step(model, "auto").new_runner()
    auto.forward(ids[:3])
    auto.forward(ids[3:])
    assert auto.compiled  # built, so "auto" uses it
    auto.step = "eager"
    auto.forward(ids[3:])
    assert auto.compiled  # an answer keeps its mode to the end
    auto.truncate(0)
    auto.forward(ids[:3])
    assert not auto.compiled  # the next answer takes the new mode


def test_without_a_compiler_it_says_why_once_and_stays_eager(monkeypatch, tmp_path, caplog):
    monkeypatch.setattr(compiled, "LIBRARY", compiled.StepLibrary())  # nothing loaded or tried yet
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on it
    with pytest.raises(compiled.Unavailable, match="no C\\+\\+ compiler found"):
        compiled.build()
    with caplog.at_level("WARNING", logger="specula.engine.cpu.step"):
        compiled.prepare(wait=False)
        compiled.wait(30)
        compiled.prepare(wait=True)
    assert compiled.status() == "eager: no C++ compiler found (set CXX, or install g++)"
    assert sum("stays eager" in r.getMessage() for r in caplog.records) == 1
    model = _with_step(native(tiny_model(vocab=64, layers=2, seed=8)), "auto")
    runner = model.new_runner()
    runner.forward(torch.tensor([1, 2]))
    assert not runner.compiled


def test_build_step_builds_ahead_says_how_long_and_succeeds_without_a_compiler(monkeypatch, tmp_path, capsys):
    """`specula build-step` (make setup runs it): with a compiler it builds the step into the cache, times the build
    for the next estimate and says where the library is; without one it says what that costs and exits 0."""
    from specula.engine.cli.main import main

    monkeypatch.setattr(compiled, "LIBRARY", compiled.StepLibrary())
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(tmp_path / "cache"))
    fake = tmp_path / "fake-cxx"  # a compiler that writes an empty library where it is asked to
    fake.write_text('#!/bin/sh\ncase "$1" in --version) echo fake 1.0; exit 0;; esac\n'
                    'while [ $# -gt 1 ]; do [ "$1" = -o ] && touch "$2"; shift; done\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    assert compiled.build_estimate() == compiled.FIRST_BUILD_S
    assert main(["build-step"]) == 0
    out = capsys.readouterr().out
    assert f"about {round(compiled.FIRST_BUILD_S)} s" in out and "built in" in out
    assert compiled.built() and compiled.build_estimate() < compiled.FIRST_BUILD_S  # this build's own time
    assert main(["build-step"]) == 0 and "is built for this CPU" in capsys.readouterr().out
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no compiler on it
    assert main(["build-step"]) == 0
    err = capsys.readouterr().err
    assert "cannot be built here: no C++ compiler found" in err and "\n" not in err.strip()


def test_a_failed_build_names_the_compilers_error(monkeypatch, tmp_path):
    fake = tmp_path / "fake-cxx"
    fake.write_text("#!/bin/sh\necho 'step.cpp:1:1: error: this compiler is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(compiled.Unavailable, match="failed: step.cpp:1:1: error: this compiler is broken"):
        compiled.build()
    assert not list((tmp_path / "cache" / "compiled").glob("*"))  # nothing half-built is left
    # a full disk: the compiler's own errors that follow from it come first in its output, the cause is named
    fake.write_text("#!/bin/sh\necho 'step.cpp: fatal error: cannot write object' >&2\n"
                    "echo '/usr/bin/ld: final link failed: No space left on device' >&2\nexit 1\n")
    with pytest.raises(compiled.Unavailable, match="No space left on device"):
        compiled.build()


def test_a_build_leaves_another_processes_build_alone(monkeypatch, tmp_path):
    """Two processes building at once (the app's engine and a command line on a first start): a build clears
    what a killed build left, never the output of one going on."""
    import subprocess

    fake = tmp_path / "fake-cxx"
    fake.write_text('#!/bin/sh\nfor a; do [ "$prev" = "-o" ] && echo built > "$a"; prev="$a"; done; exit 0\n')
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(tmp_path / "cache"))
    path = compiled.library_path(str(fake))
    path.parent.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "120"])
    try:
        going = path.with_name(f"{path.name}.tmp-{other.pid}")
        killed = path.with_name(f"{path.name}.tmp-{2**22 + 12345}")  # above Linux's largest process id
        going.write_text("half")
        killed.write_text("half")
        assert compiled.build() == path and path.read_text() == "built\n"
        assert going.exists() and not killed.exists()
    finally:
        other.kill()
        other.wait()


def test_step_modes(monkeypatch):
    monkeypatch.setenv("SPECULA_STEP", "eager")
    assert compiled.step_mode("auto") == "eager"
    assert compiled.step_mode("compiled") == "compiled"  # asked for explicitly
    monkeypatch.delenv("SPECULA_STEP")
    assert compiled.step_mode("auto") == "auto"
    with pytest.raises(ValueError, match="unknown step"):
        compiled.step_mode("fast")


def test_the_bundled_model_runs_compiled_and_exactly(ops):
    """The user's model as loaded by default (native Q4_1), `step="compiled"`: prompt lookup and plain
    decoding give the same answers, both through the compiled step."""
    from specula.engine.api.types import DecodeConfig, ModelChoice
    from specula.engine.decoding.loop import generate
    from specula.engine.drafters import build_drafter
    from specula.engine.models.loading import load_model

    model = load_model(ModelChoice("bundled", device="cpu", dtype="bf16", step="compiled"))
    assert model.step_status == "compiled"
    for text in ("Rename total to subtotal: total = price * qty\nprint(total)", "List three colours."):
        prompt = model.tokenizer(text)["input_ids"]
        answers = []
        for strategy in ("none", "prompt-lookup"):
            runner = model.new_runner()
            finished = list(generate(runner, build_drafter(strategy, model, None), prompt,
                                     DecodeConfig(k=5, max_new_tokens=40)))[-1]
            assert runner.compiled
            answers.append(finished.token_ids)
        assert answers[0] == answers[1]


def test_a_damaged_library_in_the_cache_is_built_again(monkeypatch, tmp_path):
    """A file that is not a library where the build's output belongs (a full disk, a bad copy) is
    replaced by a fresh build, and the step loads."""
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler here")
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiled, "LIBRARY", compiled.StepLibrary())  # nothing loaded or tried yet
    source = tmp_path / "native" / "step.cpp"  # a small source: the rebuild, not the step, is under test
    source.parent.mkdir()
    source.write_text('extern "C" int specula_step_probe() { return 1; }\n')
    monkeypatch.setattr(compiled, "SOURCE", source)

    def load(path):  # as torch.ops.load_library reads a file (this process has the real library already)
        if not path.read_bytes().startswith(b"\x7fELF"):
            raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setattr(compiled, "_load", load)
    path = compiled.library_path(compiled._compiler())
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a library")
    compiled.prepare(wait=True)
    assert compiled.error() is None
    assert path.read_bytes().startswith(b"\x7fELF")  # rebuilt


@pytest.mark.parametrize("strategy", ["none", "prompt-lookup", "eagle", "auto"])
def test_a_conversation_continued_keeps_what_the_cache_holds_and_answers_as_if_read_anew(ops, strategy, tmp_path):
    """A second turn's prompt begins with the first turn's prompt and answer: the cache keeps them (after chains,
    a tree strategy's kept paths, another strategy's answer) and only the rest is read; every answer is the one a
    runner reading the whole prompt anew gives, token for token. An answer asked again keeps all but the prompt's
    last token."""
    from specula.engine.api.events import Finished
    from specula.engine.api.types import DecodeConfig
    from specula.engine.decoding.loop import generate
    from specula.engine.drafters import build_drafter

    target = _with_step(native(tiny_model(vocab=64, layers=3, seed=9), formats=("Q4_1", "Q8_0"), head="Q8_0"))
    drafter = build_drafter(strategy, target, None, **head_options(target, strategy, tmp_path))
    config = DecodeConfig(k=4, max_new_tokens=24)
    gen = torch.Generator().manual_seed(2)
    kept_runner = target.new_runner()
    rows = []
    forward = kept_runner.forward
    kept_runner.forward = lambda tokens, *a, **kw: rows.append(tokens.shape[0]) or forward(tokens, *a, **kw)
    conversation = torch.randint(0, 64, (9,), generator=gen).tolist()
    read = []
    for turn in range(4):
        held = kept_runner.length
        reused = kept_runner.reusable(torch.tensor(conversation))
        rows.clear()
        warm = list(generate(kept_runner, drafter, conversation, config))[-1]
        assert rows[0] == len(conversation) - reused  # the prompt's rest, read in one pass
        cold = list(generate(target.new_runner(), build_drafter("none", target, None), conversation, config))[-1]
        assert isinstance(warm, Finished) and warm.token_ids == cold.token_ids, (strategy, turn)
        read.append((held, reused, len(conversation)))
        if turn < 2:  # then the same prompt again
            conversation += list(warm.token_ids) + torch.randint(0, 64, (5,), generator=gen).tolist()
    assert read[0] == (0, 0, 9)
    assert read[1][1] > 9 and read[2][1] > read[1][2]  # the earlier turns' prompts and answers at least
    assert read[3][1] == read[3][2] - 1  # asked again: everything but the prompt's last token
    # a prompt that departs from what the cache holds keeps the positions before it, and only those
    changed = torch.tensor(conversation)
    changed[5] = (changed[5] + 1) % 64
    assert kept_runner.reusable(changed) == 5


def test_only_a_cache_whose_bits_do_not_depend_on_the_pass_is_kept(ops, monkeypatch):
    ids = torch.tensor([3, 4, 5, 6, 7, 8])
    fp32 = _with_step(LoadedModel(tiny_model(vocab=64, layers=2, seed=6), None, "tiny", torch.device("cpu"), torch.float32))
    runner = fp32.new_runner()
    runner.forward(ids)
    assert runner.reusable(ids) == 0  # a prompt read by the eager forward (dense products)
    blocks = _with_step(native(tiny_model(vocab=64, layers=2, seed=6))).new_runner()
    blocks.forward(ids)
    assert blocks.reusable(ids) == 5
    monkeypatch.setattr(lean_runner, "prompt_through_step", lambda fast, dtype: False)
    assert blocks.reusable(ids) == 0  # prompts read eagerly again: no longer the bits of steps
    eager = _with_step(native(tiny_model(vocab=64, layers=2, seed=6)), "eager").new_runner()
    eager.forward(ids)
    assert eager.reusable(ids) == 0


def test_the_tokens_the_cache_holds_follow_tree_passes_and_batched_steps(ops):
    target = _with_step(native(tiny_model(vocab=64, layers=2, seed=3)))
    runner = target.new_runner()
    runner.forward(torch.tensor([1, 2, 3]))
    runner.forward(torch.tensor([10, 11, 12, 13]), last=4, tree=TokenTree((-1, 0, 0, 2)))  # rows 0 -> 2 -> 3 kept
    runner.keep(3, [0, 2, 3])
    assert runner.reusable(torch.tensor([1, 2, 3, 10, 12, 13, 99])) == 6
    assert runner.reusable(torch.tensor([1, 2, 3, 10, 11, 13, 99])) == 4
    other = target.new_runner()
    other.forward(torch.tensor([7, 8]))
    step_rows([runner, other], torch.tensor([20, 21]))
    assert runner.reusable(torch.tensor([1, 2, 3, 10, 12, 13, 20, 0])) == 7
    assert other.reusable(torch.tensor([7, 8, 21, 0])) == 3


@pytest.mark.parametrize("family,kind", [("gemma3", "eagle3"), ("phi3", "medusa"), ("olmo2", "eagle3"), ("gemma2", "medusa"),
                                         ("granite", "eagle")])
def test_draft_heads_train_on_every_family_and_keep_plain_decodings_answer(ops, family, kind, tmp_path):
    """train-head's kinds on the families the compiled step runs (the target's own final norm and scaled embeddings
    where the family has them; EAGLE-3 reading three of its layers): the head trains, loads, drafts tokens that are
    accepted, and the answers are `none`'s."""
    from tests.support.tiny import quick_head

    target = _with_step(native(tiny_model(vocab=64, layers=4, seed=11, family=family), formats=("Q8_0",)))
    head = quick_head(target, tmp_path / kind, sequences=4, length=24, epochs=2, kind=kind)
    strategy = "medusa" if kind == "medusa" else "eagle"
    assert_greedy_identity(target, None, strategy, {"head": str(head)}, trials=2, longest_prompt=40, max_new_tokens=32)
