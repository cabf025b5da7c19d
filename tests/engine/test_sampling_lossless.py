"""Speculative sampling keeps the target's distribution: on a 4-token vocabulary, the joint distribution
of the first three generated tokens matches the exact target distribution, for a drafter with a
distribution (draft-model, eagle, medusa) and those without (prompt-lookup, lookahead), and for auto,
which switches between them.

The statistic is Pearson's chi-square against the exact distribution (cells expected below 5 pooled):
a correct sampler fails it with probability 1e-4 (P_MIN); at 4,000 samples it detects a sampler whose
distribution is 0.056 away in total variation in over 90% of runs (measured), and the last test shows
it rejecting a wrong one.

The samples are drawn by two processes, half each (this one and a helper that builds the same models):
each sample is a whole generation on one thread, and a machine's second core would otherwise wait."""

import concurrent.futures
import functools
import itertools
import multiprocessing
import unittest.mock

import pytest
import torch

from specula.engine.api.types import DecodeConfig, SamplingParams
from specula.engine.decoding.loop import generate
from specula.engine.decoding.sampling import process_logits
from specula.engine.drafters import build_drafter
from specula.engine.models import layers
from tests.support.tiny import loaded, one_torch_thread, perturbed, tiny_model

VOCAB = 4
PROMPT = [0, 1, 2, 3, 1, 2]
SAMPLES = 4000
P_MIN = 1e-4  # the chance that a correct sampler fails


@functools.cache
def exact_joint(model, params, n=3):
    """P(t1..tn | PROMPT) under the processed target distribution, by enumeration (once per model and
    settings: several cases share them). The table is only read."""
    probs = {}
    with torch.no_grad():
        for seq in itertools.product(range(VOCAB), repeat=n):
            total = 1.0
            for i in range(n):
                logits = model(torch.tensor([PROMPT + list(seq[:i])])).logits[0, -1]
                total *= float(process_logits(logits, params)[seq[i]])
            probs[seq] = total
    return probs


def draw(target, drafter, params, seeds) -> tuple[dict, int]:
    """Counts of the first three tokens over generations with these seeds, and the tokens drafted."""
    runner = target.new_runner()
    counts = dict.fromkeys(itertools.product(range(VOCAB), repeat=3), 0)
    drafted = 0
    for seed in seeds:
        config = DecodeConfig(k=2, max_new_tokens=4, params=params, seed=seed)
        finished = list(generate(runner, drafter, PROMPT, config))[-1]
        counts[tuple(finished.token_ids[:3])] += 1
        drafted += finished.totals.drafted
    return counts, drafted


def build_models():
    target = tiny_model(vocab=VOCAB, layers=2, seed=5)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.25)  # undo most of the sharpening: keep every token plausible
    draft = perturbed(target, scale=1.0, seed=9)
    models = loaded(target), loaded(draft)
    # the rule is under test, not the products: plain F.linear, whose calls cost a tiny model a third less
    # than oneDNN's prepacked ones (the products are built once per model, with its first runner)
    with unittest.mock.patch.object(layers, "PREPACK_LIMIT_BYTES", 0):
        for model in models:
            model.new_runner()
    return models


_helper_models = None


def helper_draw(strategy: str, options: dict, at_once: bool, params, seeds) -> tuple[dict, int]:
    """In the helper process: the same models, a drafter of its own, these seeds."""
    global _helper_models
    torch.set_num_threads(1)
    if _helper_models is None:
        _helper_models = build_models()
    target, draft = _helper_models
    from specula.engine.decoding import verify

    before = verify.ONE_WAIT_DEVICES
    if at_once:
        verify.ONE_WAIT_DEVICES = frozenset({"cpu"})
    try:
        return draw(target, build_drafter(strategy, target, draft, **options), params, seeds)
    finally:
        verify.ONE_WAIT_DEVICES = before


def empirical_joint(target, drafter, params, samples, helper=None, job=None, min_drafted=None):
    """`samples` generations; with a helper process (and the job that builds the drafter there), the second
    half of the seeds are drawn there meanwhile."""
    half = samples // 2 if helper is not None else samples
    pending = helper.submit(helper_draw, *job, params, range(half, samples)) if helper is not None else None
    counts, drafted = draw(target, drafter, params, range(half))
    if pending is not None:
        more, more_drafted = pending.result(timeout=1800)
        counts = {key: counts[key] + more[key] for key in counts}
        drafted += more_drafted
    assert drafted > (samples if min_drafted is None else min_drafted)  # the step after the prefill really drafted
    return counts


def p_value(counts: dict, probs: dict) -> float:
    """Pearson's chi-square test of observed counts against exact probabilities; cells expected below 5
    are pooled into one; a count in a cell of probability 0 gives 0. The p-value is the chi-square
    survival function (a regularised gamma)."""
    if any(counts[k] for k in probs if probs[k] == 0):
        return 0.0
    keys = sorted(k for k in probs if probs[k] > 0)
    n = sum(counts.values())
    observed = torch.tensor([counts[k] for k in keys], dtype=torch.float64)
    expected = torch.tensor([probs[k] for k in keys], dtype=torch.float64) * n
    small = expected < 5
    if small.any():
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    chi2 = ((observed - expected) ** 2 / expected).sum()
    df = torch.tensor((len(expected) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, chi2 / 2))


@pytest.fixture(scope="module")
def models():
    with one_torch_thread():  # tiny tensors: thread hand-offs cost more than they save
        yield build_models()


@pytest.fixture(scope="module")
def helper():
    """One helper process for the module's tests (spawned: a fork would copy this process's threads)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


@pytest.mark.parametrize(
    "strategy, params",
    [
        ("draft-model", SamplingParams(temperature=1.0)),
        ("draft-model", SamplingParams(temperature=0.8, top_k=3)),
        ("prompt-lookup", SamplingParams(temperature=0.8, top_p=0.9)),
        ("eagle", SamplingParams(temperature=1.0)),
        ("medusa", SamplingParams(temperature=1.0)),
        ("lookahead", SamplingParams(temperature=0.9)),
        ("auto", SamplingParams(temperature=1.0)),
        ("eagle-tree", SamplingParams(temperature=0.8, top_p=0.95)),
        ("suffix", SamplingParams(temperature=0.9)),  # drafts from the earlier samples' answers too
        ("suffix-tree", SamplingParams(temperature=1.0)),
        ("draft-model at once", SamplingParams(temperature=1.0)),  # a GPU's rule: one wait per pass
        ("prompt-lookup at once", SamplingParams(temperature=0.8, top_p=0.9)),
    ],
)
def test_speculative_sampling_matches_the_target_distribution(models, helper, strategy, params, tmp_path, monkeypatch):
    target, draft = models
    options = {}
    at_once = strategy.endswith(" at once")
    if at_once:
        from specula.engine.decoding import verify

        strategy = strategy.removesuffix(" at once")
        monkeypatch.setattr(verify, "ONE_WAIT_DEVICES", frozenset({"cpu"}))
    if strategy.endswith("-tree"):  # a tree, verified by recursive rejection over siblings
        strategy, options["tree"] = strategy.removesuffix("-tree"), 1
    if strategy in ("eagle", "medusa", "auto"):  # untrained heads: draft distributions far from the target's
        from specula.engine.heads.config import HeadConfig
        from specula.engine.heads.eagle import EagleHead
        from specula.engine.heads.medusa import MedusaHead
        from specula.engine.heads.store import save_head
        from specula.engine.heads.train import head_info

        torch.manual_seed(0)
        config = HeadConfig.for_target(target.model.config)
        medusa = MedusaHead(config)
        for block in medusa.blocks:
            torch.nn.init.normal_(block.weight, std=0.5)
        for kind, head in (("eagle", EagleHead(config)), ("medusa", medusa)):
            save_head(head, head_info(target, kind, 0, 0, None), tmp_path / kind)
        if strategy == "auto":
            options["heads"] = (str(tmp_path / "eagle"), str(tmp_path / "medusa"))
        else:
            options["head"] = str(tmp_path / strategy)
    drafter = build_drafter(strategy, target, draft, **options)
    exact = exact_joint(target.model, params)
    # auto drafts only where drafting has measured faster than plain steps; on this tiny model that is rare
    got = empirical_joint(target, drafter, params, SAMPLES, helper, (strategy, options, at_once),
                          SAMPLES // 50 if strategy == "auto" else None)
    tv = sum(abs(got[k] / SAMPLES - exact[k]) for k in exact) / 2
    p = p_value(got, exact)
    print(f"{strategy} {params}: total variation {tv:.4f}, p = {p:.3g}")
    assert p >= P_MIN, (p, tv)


def test_the_statistic_detects_a_wrong_distribution(models):
    """Guard against a test that cannot fail: the draft's own distribution is far from the target's."""
    target, draft = models
    params = SamplingParams(temperature=1.0)
    exact = exact_joint(target.model, params)
    wrong = exact_joint(draft.model, params)
    assert sum(abs(wrong[k] - exact[k]) for k in exact) / 2 > 0.1
    keys = sorted(exact)
    gen = torch.Generator().manual_seed(0)

    def draws(probs: dict) -> dict:
        picked = torch.multinomial(torch.tensor([probs[k] for k in keys]), SAMPLES, replacement=True, generator=gen)
        return dict(zip(keys, torch.bincount(picked, minlength=len(keys)).tolist()))

    assert p_value(draws(exact), exact) >= P_MIN
    # halfway to the draft's distribution: about 0.09 from the target's in total variation
    halfway = {k: (exact[k] + wrong[k]) / 2 for k in keys}
    assert p_value(draws(halfway), exact) < P_MIN
