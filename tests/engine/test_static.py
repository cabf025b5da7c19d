"""Static steps (models/static.py), a GPU's decoding step, run and checked here on the CPU: a cache
allocated once, every step after the prefill in a bucket of fixed shape (never fewer rows than the floor),
the buckets captured as graphs in the background (a recording stand-in for CUDA graphs here)."""

import json
import logging
import threading

import pytest
import torch

from specula.engine.api.errors import ContextTooLongError
from specula.engine.cpu.step import StepMode
from specula.engine.decoding.tree import TokenTree
from specula.engine.drafters import DRAFTERS
from specula.engine.models import static
from specula.engine.models.runner import LeanRunner
from specula.engine.models.loading import LoadedModel
from tests.support.tiny import assert_greedy_identity, head_options, loaded, perturbed, tiny_model


def with_step(model: LoadedModel, step: str) -> LoadedModel:
    model.step = StepMode(step)
    return model


def bf16(model) -> LoadedModel:
    return LoadedModel(model.to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16, lean=True)


def counted(monkeypatch) -> list[int]:
    """The row counts of the static steps that run from now on."""
    rows: list[int] = []
    step = static.static_step

    def counting(self, inputs):
        rows.append(inputs.tokens.shape[0])
        return step(self, inputs)

    monkeypatch.setattr(static, "static_step", counting)
    return rows


@pytest.fixture(scope="module")
def tiny():
    return tiny_model(vocab=64, layers=4, seed=0, max_pos=160)


def test_the_bucket_of_a_pass_is_the_smallest_holding_its_rows_and_the_floor():
    assert [static.bucket(r, 1) for r in (1, 2, 3, 5, 17, 33, 64)] == [1, 2, 4, 8, 32, 64, 64]
    assert [static.bucket(r, 32) for r in (1, 9, 32, 33)] == [32, 32, 32, 64]
    assert static.bucket(65, 1) is None
    assert static.FLOOR == 32  # the rows of the longest chain pass (31 drafts and the bonus row)


def test_static_steps_give_the_eager_forwards_logits_and_features_in_fp32(tiny, monkeypatch):
    eager, fixed = with_step(loaded(tiny), "eager").new_runner(), with_step(loaded(tiny), "static").new_runner()
    assert fixed.static and not eager.static and fixed.cache.k.shape[2] == 161  # the window and a scratch slot, at once
    rows = counted(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 64, (12,), generator=gen)
    assert torch.equal(eager.forward(prompt), fixed.forward(prompt))  # the prefill runs as before
    written = 0
    for t in (1, 3, 8, 31, 40):
        tokens = torch.randint(0, 64, (t,), generator=gen)
        a, b = eager.forward(tokens, last=t), fixed.forward(tokens, last=t)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        written = max(written, fixed.length)
        eager.truncate(eager.length - t // 2)  # rolled back as a verify pass is
        fixed.truncate(fixed.length - t // 2)
    assert rows == [32, 32, 32, 32, 64]
    n = fixed.length
    torch.testing.assert_close(fixed.features(0, n), eager.features(0, n), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fixed.cache.k[:, :, :n], eager.cache.k[:, :, :n], rtol=1e-5, atol=1e-5)
    assert not fixed.cache.k[:, :, written:-1].any() and fixed.cache.k[:, :, -1].any()  # padding rows write the scratch slot only


def test_a_tree_pass_through_static_steps_sees_each_nodes_ancestors(tiny):
    tree = TokenTree((-1, 0, 0, 1, 2, 2))
    tokens = torch.tensor([5, 9, 11, 3, 7, 2])
    eager, fixed = with_step(loaded(tiny), "eager").new_runner(), with_step(loaded(tiny), "static").new_runner()
    prompt = torch.arange(20) % 64
    for r in (eager, fixed):
        r.forward(prompt)
    a = eager.forward(tokens, last=len(tree), tree=tree)
    b = fixed.forward(tokens, last=len(tree), tree=tree)
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for r in (eager, fixed):
        r.keep(20, [0, 2, 5])
    torch.testing.assert_close(fixed.forward(torch.tensor([1])), eager.forward(torch.tensor([1])), rtol=1e-5, atol=1e-5)
    assert not fixed.exact_trees  # tree drafters send their best chain, as on the CPU's own step


def test_passes_too_long_for_a_bucket_and_prompts_run_eagerly(tiny, monkeypatch):
    fixed = with_step(loaded(tiny), "static").new_runner()
    rows = counted(monkeypatch)
    fixed.forward(torch.arange(70) % 64)
    fixed.forward(torch.arange(65) % 64)  # a second turn's prompt
    assert rows == [] and fixed.length == 135
    fixed.forward(torch.tensor([1]))
    assert rows == [32]


def test_the_static_cache_holds_the_window_or_what_specula_context_says(tiny, monkeypatch):
    assert with_step(loaded(tiny), "static").new_runner().max_len == 160
    monkeypatch.setenv("SPECULA_CONTEXT", "48")
    runner = with_step(loaded(tiny), "static").new_runner()
    assert runner.max_len == 48 and runner.cache.k.shape[2] == 49
    runner.forward(torch.arange(40) % 64)
    with pytest.raises(ContextTooLongError, match="^context of 50 tokens exceeds .*SPECULA_CONTEXT.*: 48$"):
        runner.forward(torch.arange(10))
    monkeypatch.setenv("SPECULA_CONTEXT", "lots")
    assert with_step(loaded(tiny), "static").new_runner().max_len == 160


@pytest.mark.parametrize("strategy", sorted(set(DRAFTERS) - {"none"}))
def test_greedy_speculation_through_static_steps_is_plain_decoding_in_bf16(strategy, tmp_path):
    # bf16 random weights: flat distributions with near ties, where one different bit shows; a single
    # step meets the kernels of a verify pass because both run as the floor's 32 rows
    target = with_step(bf16(tiny_model(vocab=64, layers=4, seed=7)), "static")
    draft = with_step(bf16(perturbed(tiny_model(vocab=64, layers=4, seed=7), scale=0.05)), "static")
    options = head_options(target, strategy, tmp_path)
    assert_greedy_identity(target, draft, strategy, options, trials=6, longest_prompt=40, max_new_tokens=48)


def recorded(step, inputs, pool, stream):
    """A stand-in for CUDA graph capture on the CPU: replaying runs the step again on the captured input
    buffers and writes the captured output buffer, as a graph does."""
    out = step(inputs)
    recorded.replays = getattr(recorded, "replays", 0)

    def replay():
        out.copy_(step(inputs))
        recorded.replays += 1

    return replay, out, pool


def graphs_runner(model: LoadedModel, monkeypatch, capture=recorded) -> LeanRunner:
    monkeypatch.setattr(static.StepGraphs, "capture", staticmethod(capture))
    return LeanRunner(model.model, step=StepMode.STATIC, static=True, graphs=True, floor=8)


def test_captured_steps_replay_what_eager_steps_compute(tiny, monkeypatch):
    runner = graphs_runner(loaded(tiny), monkeypatch)
    assert runner.graphs.wait(timeout=120)  # captured in the background, every bucket from the floor up
    assert runner.graphs.captured == (8, 16, 32, 64)
    plain = LeanRunner(tiny, step=StepMode.STATIC, static=True, floor=8)
    recorded.replays = 0
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 64, (9,), generator=gen)
    assert torch.equal(runner.forward(prompt), plain.forward(prompt))
    held = []
    for t in (1, 5, 12, 1, 30):
        tokens = torch.randint(0, 64, (t,), generator=gen)
        a = runner.forward(tokens, last=t)
        assert torch.equal(a, plain.forward(tokens, last=t))
        held.append((a, a.clone()))
    assert recorded.replays == 5
    assert all(torch.equal(a, copy) for a, copy in held)  # what a step returned is not overwritten by the next
    assert torch.equal(runner.features(0, runner.length), plain.features(0, plain.length))


def test_new_buffers_are_captured_again_and_run_eagerly_meanwhile(tiny, monkeypatch):
    runner = graphs_runner(loaded(tiny), monkeypatch)
    assert runner.graphs.wait(timeout=120)
    plain = LeanRunner(tiny, step=StepMode.STATIC, static=True, floor=8)
    old = runner.cache.aux
    for r in (runner, plain):
        r.keep_layers((0, 2))  # an EAGLE-3 head's layers: the states buffer is new
    assert runner.cache.aux is not old and all(c.layout[4] is runner.cache.aux for c in runner.graphs._ready.values())
    prompt = torch.arange(15) % 64
    for r in (runner, plain):
        r.forward(prompt)
    assert torch.equal(runner.forward(torch.tensor([4])), plain.forward(torch.tensor([4])))  # eager meanwhile
    assert runner.graphs.wait(timeout=120)
    recorded.replays = 0
    assert torch.equal(runner.forward(torch.tensor([4, 5, 6]), last=3), plain.forward(torch.tensor([4, 5, 6]), last=3))
    assert recorded.replays == 1
    assert torch.equal(runner.aux_features(0, runner.length), plain.aux_features(0, plain.length))


def test_a_failed_capture_says_so_once_and_steps_run_without_graphs(tiny, monkeypatch, caplog):
    def failing(step, inputs, pool, stream):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")

    with caplog.at_level(logging.WARNING, logger="specula.engine.models.static"):
        runner = graphs_runner(loaded(tiny), monkeypatch, capture=failing)
        runner.graphs.wait(timeout=120)
    assert runner.graphs.error == "operation not permitted when stream is capturing"
    lines = [r.getMessage() for r in caplog.records if r.name == "specula.engine.models.static"]
    assert lines == ["step graphs could not be captured (operation not permitted when stream is capturing): "
                     "steps run without them"]
    plain = LeanRunner(tiny, step=StepMode.STATIC, static=True, floor=8)
    for r in (runner, plain):
        r.forward(torch.arange(6))
    assert torch.equal(runner.forward(torch.tensor([7, 8]), last=2), plain.forward(torch.tensor([7, 8]), last=2))
    runner.graphs.start()  # no second try, no second line
    assert runner.graphs.captured == () and len(caplog.records) == 1


def test_capture_runs_beside_answers_and_holds_them_only_while_recording(tiny, monkeypatch):
    release = threading.Event()
    step = static.static_step

    def slow_in_the_background(self, inputs):  # the capture thread's warm-up runs wait for the event
        if threading.current_thread().name == "specula-graphs":
            release.wait(timeout=120)
        return step(self, inputs)

    monkeypatch.setattr(static, "static_step", slow_in_the_background)
    runner = graphs_runner(loaded(tiny), monkeypatch)
    plain = LeanRunner(tiny, step=StepMode.STATIC, static=True, floor=8)
    for r in (runner, plain):
        r.forward(torch.arange(6))
    for token in range(5):  # while the first capture is under way
        assert torch.equal(runner.forward(torch.tensor([token])), plain.forward(torch.tensor([token])))
    assert runner.graphs.captured == ()
    release.set()
    assert runner.graphs.wait(timeout=120)
    recording = threading.Event()
    done = threading.Event()

    def recorder(step, inputs, pool, stream):  # a capture that takes a while
        recording.set()
        done.wait(timeout=120)
        return recorded(step, inputs, pool, stream)

    runner.graphs.capture = staticmethod(recorder)
    runner.keep_layers((1,))  # the buffers change: captured again
    assert recording.wait(timeout=120)
    waited = threading.Thread(target=runner.forward, args=(torch.arange(4),))
    waited.start()
    waited.join(timeout=0.5)
    assert waited.is_alive()  # a pass waits while a graph is recorded
    done.set()
    waited.join(timeout=120)
    assert not waited.is_alive() and runner.length == 4


@pytest.mark.parametrize("device,step,static_,graphs", [
    ("cpu", "auto", False, False), ("cpu", "eager", False, False), ("cpu", "static", True, False),
    ("cuda", "auto", True, True), ("cuda", "compiled", True, True), ("cuda", "static", True, False),
    ("cuda", "eager", False, False),
])
def test_which_devices_and_steps_run_static_steps_and_graphs(tiny, device, step, static_, graphs):
    model = LoadedModel(tiny, None, "tiny", torch.device(device), torch.float32, lean=True)
    model.step = StepMode(step)
    assert (model.static, model.graphs) == (static_, graphs)
    if static_:
        assert model.step_status == ("graphs" if graphs else "static")


def test_generate_with_step_static_gives_the_eager_answer(tiny_folder, capsys):
    from specula.engine.cli.main import main

    answers = []
    for step in ("eager", "static"):
        assert main(["generate", "--model", str(tiny_folder), "--dtype", "fp32", "--step", step, "--strategy",
                     "prompt-lookup", "--prompt", "one two three one two three", "--max-new-tokens", "24",
                     "--json"]) == 0
        answers.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert answers[0]["token_ids"] == answers[1]["token_ids"] and len(answers[1]["token_ids"]) > 0


@pytest.mark.parametrize("family", ["gemma3", "gemma2", "phi3", "granite", "olmo2", "ministral", "exaone4"])
def test_static_steps_of_every_family_give_the_eager_forwards_logits_in_fp32(family):
    """A GPU's step reads a layer as the eager forward does: Gemma's norms and windows (8 positions, passed early here),
    Gemma 2's soft-capping, Phi-3's fused weights and partial rotary, Granite's multipliers, OLMo 2's norms; chains and
    a tree."""
    model = tiny_model(vocab=64, layers=4, seed=3, family=family, max_pos=128)
    eager, fixed = with_step(loaded(model), "eager").new_runner(), with_step(loaded(model), "static").new_runner()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 64, (12,), generator=gen)
    torch.testing.assert_close(fixed.forward(prompt), eager.forward(prompt), rtol=1e-5, atol=1e-5)
    for t in (1, 3, 8, 20):
        tokens = torch.randint(0, 64, (t,), generator=gen)
        torch.testing.assert_close(fixed.forward(tokens, last=t), eager.forward(tokens, last=t), rtol=1e-5, atol=1e-5)
        eager.truncate(eager.length - t // 2)
        fixed.truncate(fixed.length - t // 2)
    tree, tokens = TokenTree((-1, 0, 0, 1, 2, 2)), torch.tensor([5, 9, 11, 3, 7, 2])
    torch.testing.assert_close(fixed.forward(tokens, last=6, tree=tree), eager.forward(tokens, last=6, tree=tree),
                               rtol=1e-5, atol=1e-5)
