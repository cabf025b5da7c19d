"""Greedy speculation must reproduce the target's own greedy tokens, for every registered drafter."""

import dataclasses
import zlib

import pytest
import torch

from specula.engine.api.events import Finished, Origin, Step
from specula.engine.api.types import DecodeConfig, SamplingParams
from specula.engine.decoding.loop import generate
from specula.engine.drafters import DRAFTERS, build_drafter
from tests.support.tiny import loaded, perturbed, quick_head, tiny_model

HEADS: dict[int, dict[str, str]] = {}  # id of a loaded target -> kind -> folder of a head trained for it


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = loaded(tiny_model(vocab=64, layers=4, seed=0))
    HEADS[id(target)] = {kind: str(quick_head(target, tmp_path_factory.mktemp(kind), kind=kind)) for kind in ("eagle", "medusa")}
    return target, loaded(perturbed(target.model, scale=0.05))


def run(target, draft, strategy, prompt, **config):
    info = DRAFTERS[strategy]
    options = {"head": HEADS[id(target)][info.needs_head]} if info.needs_head else {}
    if info.uses_heads:
        options = {"heads": tuple(HEADS[id(target)].values())}
    drafter = build_drafter(strategy, target, draft, **options)
    runner = target.new_runner()
    events = list(generate(runner, drafter, prompt, DecodeConfig(**config), stop_ids=target.eos_ids, strategy=strategy))
    return events


def plain_greedy(model, prompt, n):
    """Reference: the model's own forward over the growing sequence, no cache, argmax each time."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_none_matches_the_models_own_greedy_decoding(models):
    target, _ = models
    prompt = [3, 14, 15, 9, 26, 5]
    finished = run(target, None, "none", prompt, max_new_tokens=40)[-1]
    assert list(finished.token_ids) == plain_greedy(target.model, prompt, 40)


@pytest.mark.parametrize("strategy", sorted(DRAFTERS))
def test_greedy_matches_plain_decoding(models, strategy):
    target, draft = models
    gen = torch.Generator().manual_seed(zlib.crc32(strategy.encode()) % 1000)  # the same prompts every run
    drafted = accepted = 0
    for trial in range(12):
        length = int(torch.randint(1, 30, (1,), generator=gen))
        prompt = torch.randint(0, 64, (length,), generator=gen).tolist()
        k = 1 + trial % 7
        adaptive = trial % 3 == 0
        base = run(target, draft, "none", prompt, max_new_tokens=50)[-1]
        events = run(target, draft, strategy, prompt, k=k, adaptive_k=adaptive, max_new_tokens=50, seed=trial)
        spec = events[-1]
        assert isinstance(spec, Finished)
        assert spec.token_ids == base.token_ids, (strategy, prompt, k)
        streamed = [t.id for e in events if isinstance(e, Step) for t in e.tokens]
        assert tuple(streamed) == spec.token_ids
        drafted += spec.totals.drafted
        accepted += spec.totals.accepted
    if strategy != "none":
        assert drafted > 0 and accepted > 0  # speculation really happened


@pytest.mark.parametrize("strategy", ["prompt-lookup", "draft-model"])
def test_transformers_fallback_forward_is_lossless_too(models, strategy):
    target, draft = models
    fallback = loaded(target.model, lean=False)
    assert not fallback.uses_lean_forward
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    base = run(target, None, "none", prompt, max_new_tokens=40)[-1]
    spec = run(fallback, draft, strategy, prompt, k=5, max_new_tokens=40)[-1]
    assert spec.token_ids == base.token_ids


def test_qwen2_family_is_lossless():
    target = loaded(tiny_model(vocab=64, family="qwen2", seed=3))
    draft = loaded(perturbed(target.model, scale=0.05))
    prompt = [7, 8, 9, 7, 8, 9, 1]
    base = run(target, None, "none", prompt, max_new_tokens=40)[-1]
    for strategy in ("prompt-lookup", "draft-model", "layer-skip"):
        assert run(target, draft, strategy, prompt, k=4, max_new_tokens=40)[-1].token_ids == base.token_ids


def test_origins_are_consistent_with_the_counts(models):
    target, draft = models
    events = run(target, draft, "draft-model", [5, 6, 7], k=4, max_new_tokens=60)
    for e in events:
        if not isinstance(e, Step) or e.step == 0:
            continue
        origins = [t.origin for t in e.tokens]
        assert origins[: e.accepted] == [Origin.DRAFT] * e.accepted
        if len(e.tokens) > e.accepted:
            # a step that drafted nothing (the live speedup's plain steps) is the target's own token
            expected = Origin.TARGET if e.drafted == 0 else Origin.BONUS if e.accepted == e.drafted else Origin.CORRECTION
            assert origins[e.accepted] == expected
        assert len(e.rejected) == e.drafted - e.accepted
        assert all(t.origin == Origin.REJECTED for t in e.rejected)


def test_stops_at_a_stop_token_and_leaves_it_out(models):
    target, _ = models
    prompt = [3, 14, 15, 9]
    full = run(target, None, "none", prompt, max_new_tokens=30)[-1].token_ids
    stop = full[5]
    first = full.index(stop)
    stopping = loaded(target.model, eos=frozenset({stop}))
    for strategy in ("none", "prompt-lookup"):
        events = run(stopping, None, strategy, prompt, max_new_tokens=30)
        assert events[-1].reason == "eos"
        assert events[-1].token_ids == full[:first]


def test_length_limit_is_exact(models):
    target, draft = models
    for n in (1, 2, 7):
        finished = run(target, draft, "draft-model", [1, 2, 3], k=8, max_new_tokens=n)[-1]
        assert len(finished.token_ids) == n and finished.reason == "length"


def test_sampling_with_a_seed_repeats(models):
    target, draft = models
    params = SamplingParams(temperature=1.0, top_p=0.9)
    for strategy in ("none", "draft-model", "prompt-lookup"):
        a = run(target, draft, strategy, [4, 5, 6], max_new_tokens=30, params=params, seed=11)[-1]
        b = run(target, draft, strategy, [4, 5, 6], max_new_tokens=30, params=params, seed=11)[-1]
        c = run(target, draft, strategy, [4, 5, 6], max_new_tokens=30, params=params, seed=12)[-1]
        assert a.token_ids == b.token_ids
        assert a.token_ids != c.token_ids


def test_other_architectures_run_through_the_transformers_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=256, eos_token_id=0, bos_token_id=0)
    target = loaded(GPT2LMHeadModel(config).eval())
    assert not target.uses_lean_forward and target.context_window == 256
    draft = loaded(perturbed(target.model, scale=0.05))
    gen = torch.Generator().manual_seed(0)
    for trial in range(4):
        prompt = torch.randint(0, 64, (8,), generator=gen).tolist()
        base = run(target, None, "none", prompt, max_new_tokens=30)[-1]
        assert base.token_ids == tuple(plain_greedy(target.model, prompt, 30))
        for strategy in ("prompt-lookup", "draft-model"):
            assert run(target, draft, strategy, prompt, k=1 + trial, max_new_tokens=30)[-1].token_ids == base.token_ids


def test_the_fused_attention_path_used_off_the_cpu_is_lossless_too(models, monkeypatch):
    """GPUs take the fused attention kernel over a cache in the model's dtype; run that path here."""
    from specula.engine.models.runner import LeanRunner

    original = LeanRunner.__init__

    def fused_path(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.blocked, self.consistent = False, False
        self.cache.shape = dataclasses.replace(self.cache.shape, kv_dtype=self.dtype)  # empty yet: made in this dtype

    monkeypatch.setattr(LeanRunner, "__init__", fused_path)
    target, draft = models
    assert not target.new_runner().blocked
    gen = torch.Generator().manual_seed(5)
    for trial in range(6):
        prompt = torch.randint(0, 64, (int(torch.randint(1, 30, (1,), generator=gen)),), generator=gen).tolist()
        assert run(target, None, "none", prompt, max_new_tokens=30)[-1].token_ids == tuple(plain_greedy(target.model, prompt, 30))
        base = run(target, None, "none", prompt, max_new_tokens=30)[-1]
        for strategy in ("prompt-lookup", "draft-model", "layer-skip"):
            spec = run(target, draft, strategy, prompt, k=1 + trial, max_new_tokens=30)[-1]
            assert spec.token_ids == base.token_ids, (strategy, trial)


def test_a_drafting_strategy_takes_plain_steps_to_measure_its_speedup_and_stays_lossless(models):
    from specula.engine.decoding.speedup import MIN_PLAIN, PROBE_EVERY

    target, draft = models
    base = run(target, None, "none", [5, 6, 7], max_new_tokens=120)
    events = run(target, draft, "draft-model", [5, 6, 7], k=4, max_new_tokens=120)
    steps = [e for e in events if isinstance(e, Step) and e.step > 0]
    plain = [s.step for s in steps if s.drafted == 0]
    assert len(plain) >= MIN_PLAIN  # the draft model always drafts: these are the decoder's own plain steps
    assert all(b - a <= PROBE_EVERY + 1 for a, b in zip(plain, plain[1:]))
    assert events[-1].token_ids == base[-1].token_ids  # a plain step is what `none` does: nothing changes
    assert events[-1].speedup is not None and steps[-1].speedup == events[-1].speedup
    assert base[-1].speedup == pytest.approx(1.0, abs=0.02)  # every step of `none` is a plain one


def test_a_near_tie_in_fp32_does_not_part_medusa_from_plain_decoding(models):
    """On this prompt the target's two best logits at token 42 are 5 ulps apart in fp32: a tree pass
    tipped it the other way, so on a CPU tree drafters send chains (bit-exact) unless told otherwise."""
    target, draft = models
    prompt = [20, 61, 47, 58, 38, 35, 29, 48, 7, 14, 26, 6, 34]
    assert not target.new_runner().exact_trees
    base = run(target, draft, "none", prompt, max_new_tokens=50)[-1]
    for _ in range(3):
        spec = run(target, draft, "medusa", prompt, k=2, max_new_tokens=50, seed=8)[-1]
        assert spec.token_ids == base.token_ids


@pytest.mark.parametrize("strategy", ["none", "prompt-lookup", "eagle", "medusa", "draft-model"])
def test_a_long_prompt_is_read_in_chunks_with_progress_and_answers_stay_the_same(models, strategy, monkeypatch):
    """A prompt over PROMPT_CHUNK tokens is read chunk by chunk, saying how far after each, and every
    strategy answers it as `none` does; the model's own greedy decoding over the whole prompt agrees."""
    from specula.engine.api.events import PromptProgress
    from specula.engine.decoding import loop

    monkeypatch.setattr(loop, "PROMPT_CHUNK", 40)
    monkeypatch.setattr(loop, "PROGRESS_AFTER_S", 0.0)
    target, draft = models
    prompt = torch.randint(0, 64, (130,), generator=torch.Generator().manual_seed(5)).tolist()
    base = run(target, draft, "none", prompt, max_new_tokens=30)
    events = run(target, draft, strategy, prompt, max_new_tokens=30)
    progress = [(e.done, e.total) for e in events if isinstance(e, PromptProgress)]
    assert progress == [(40, 130), (80, 130), (120, 130)]
    assert events[-1].token_ids == base[-1].token_ids
    if strategy == "none":
        assert list(base[-1].token_ids) == plain_greedy(target.model, prompt, 30)


def test_what_is_left_of_a_long_read_is_estimated_with_a_cost_that_grows_along_the_prompt():
    """A token costs more the later it sits (attention reads all before it): the estimate fits the cost per token
    as a line over the chunks read, where the rate so far said 7 s left at 21% of a 40 s read. It also travels
    to a remote client as it is."""
    from specula.engine.api import wire
    from specula.engine.api.events import PromptProgress
    from specula.engine.decoding.loop import reading_left

    cost = lambda p: 1e-3 + 1e-6 * p  # noqa: E731 - seconds for the token at position p
    total, size, chunks, spent = 7484, 512, [], 0.0
    while total - sum(c[1] for c in chunks) > size:
        first = sum(c[1] for c in chunks)
        seconds = sum(cost(p) for p in range(first, first + size)) * (1.03 if len(chunks) % 2 else 0.97)  # noise
        chunks.append((first, size, seconds))
        spent += seconds
        rest = sum(cost(p) for p in range(first + size, total))
        left = reading_left(chunks, total)
        if len(chunks) >= 2:  # a slope from two noisy chunks is rougher
            assert abs(left - rest) < (0.3 if len(chunks) == 2 else 0.12) * rest, (len(chunks), left, rest)
        done = first + size
        linear = spent * (total - done) / done
        if done / total > 0.2 and done / total < 0.3:
            assert linear < 0.4 * rest and PromptProgress(0, done, total, spent, left).left_s == left
    assert reading_left([], total) is None
    event = PromptProgress(3, 512, 7484, 1.5, 30.25)
    assert wire.progress_from(wire.progress_json(event), 3) == event
    assert wire.progress_from({"done": 512, "total": 7484, "elapsed_s": 1.5}, 3).left_s == 1.5 * (7484 - 512) / 512


def test_a_long_prompt_can_be_cancelled_while_it_is_read(models, monkeypatch):
    from specula.engine.api.events import PromptProgress
    from specula.engine.decoding import loop

    monkeypatch.setattr(loop, "PROMPT_CHUNK", 40)
    monkeypatch.setattr(loop, "PROGRESS_AFTER_S", 0.0)
    target, _ = models
    events = []
    for e in generate(target.new_runner(), build_drafter("none", target, None), list(range(1, 60)) * 3,
                      DecodeConfig(max_new_tokens=10),
                      should_stop=lambda: any(isinstance(x, PromptProgress) for x in events)):
        events.append(e)  # the user cancels once the first progress shows
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled" and not events[-1].token_ids
    assert sum(isinstance(e, PromptProgress) for e in events) == 1


def test_the_draft_length_policy_is_kept_from_one_answer_to_the_next(models):
    """What a strategy measured in one answer (acceptance, pass costs) holds in the next: the second
    answer does not draft the full k for a warm-up again, and its answer is still the target's own."""
    target, draft = models
    drafter = build_drafter("draft-model", target, draft)
    config = DecodeConfig(k=4, max_new_tokens=40)
    first = list(generate(target.new_runner(), drafter, [5, 6, 7], config, stop_ids=target.eos_ids))
    lengths = drafter.lengths(4)
    assert lengths.warm
    chosen, drafting = lengths.steps, lengths.drafting_steps
    second = list(generate(target.new_runner(), drafter, [9, 8, 7, 6], config, stop_ids=target.eos_ids))
    assert drafter.lengths(4) is lengths
    decode_steps = [e for e in second if isinstance(e, Step) and e.step > 0]
    assert lengths.steps > chosen and lengths.drafting_steps - drafting == sum(s.drafted > 0 for s in decode_steps)
    assert first[-1].token_ids == run(target, None, "none", [5, 6, 7], max_new_tokens=40)[-1].token_ids
    assert second[-1].token_ids == run(target, None, "none", [9, 8, 7, 6], max_new_tokens=40)[-1].token_ids
    assert drafter.lengths(6) is not lengths  # another longest draft: measured again
