"""auto's choice from measured speed, and lookahead's Jacobi window and n-gram pool, on scripted steps."""

import torch

from engine.drafters import auto as auto_module
from engine.drafters.auto import Auto
from engine.drafters.base import Draft, DraftContext
from engine.drafters.lookahead import Lookahead
from engine.sampling import SamplingParams


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Guesser:
    """A head stand-in that always drafts four tokens."""

    learns_from_tree = False

    def __init__(self):
        self.calls = 0

    def reset(self):
        pass

    def propose(self, ctx, k):
        self.calls += 1
        return Draft(torch.tensor([1, 2, 3, 4][:k]))

    def observe(self, accepted, next_token):
        pass


def drive(auto, clock, steps, cost, gained):
    """Run `steps` scripted steps: a step drafted by `name` takes cost[name] seconds and keeps gained[name] drafts."""
    chosen = []
    ctx = DraftContext(torch.tensor([5, 6, 7, 8, 9]), 2, SamplingParams(), None)  # no earlier match: no lookup
    for _ in range(steps):
        auto.propose(ctx, 8)
        name = auto.chosen
        chosen.append(name)
        clock.now += cost[name]
        auto.observe(gained[name], 0)
    return chosen


def test_auto_keeps_to_the_fastest_choice_and_re_measures_now_and_then(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(auto_module.time, "perf_counter", clock)
    auto = Auto({"eagle": (Guesser(), 6)})
    # eagle: 3 tokens in 0.05 s (60/s) beats none: 1 token in 0.03 s (33/s)
    steps = 2 * auto_module.EXPLORE_EVERY
    chosen = drive(auto, clock, steps, {"none": 0.03, "eagle": 0.05}, {"none": 0, "eagle": 2})
    assert chosen[:4] == ["none", "none", "eagle", "eagle"]  # each choice measured first
    assert chosen[4:].count("eagle") >= steps - 8 and "none" in chosen[4:]  # mostly eagle, none re-measured


def test_auto_falls_back_to_plain_steps_when_drafting_does_not_pay(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(auto_module.time, "perf_counter", clock)
    guesser = Guesser()
    auto = Auto({"eagle": (guesser, 6)})
    chosen = drive(auto, clock, 64, {"none": 0.03, "eagle": 0.05}, {"none": 0, "eagle": 0})
    assert chosen[4:].count("none") >= 56
    assert guesser.calls <= 8


def test_auto_uses_prompt_lookup_where_the_context_repeats(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(auto_module.time, "perf_counter", clock)
    auto = Auto()
    ctx = DraftContext(torch.tensor([1, 2, 3, 4, 9, 1, 2, 3]), 2, SamplingParams(), None)
    names = []
    for _ in range(20):
        draft = auto.propose(ctx, 8)
        names.append(auto.chosen)
        clock.now += 0.03 if auto.chosen == "none" else 0.035
        auto.observe(draft.tokens.shape[0], 0)
    assert names[-1] == "prompt-lookup:2-3" and names.count("prompt-lookup:2-3") >= 14


def test_lookahead_moves_its_window_by_jacobi_steps_and_collects_diagonal_n_grams():
    la = Lookahead(window=3, ngram=3, guesses=2, force_tree=True)
    ctx = DraftContext(torch.tensor([1, 2, 3]), 1, SamplingParams(), None)
    draft = la.propose(ctx, 5)
    first = list(la.window)
    assert draft.tokens.tolist()[-3:] == first or len(draft.tokens) < 6  # the window is one chain of the tree
    # the target's argmax after each window slot: the next window
    la.observe_tree({i: 20 + j for j, i in enumerate(la.slots)})
    la.observe(0, 11)
    assert la.window == [20, 21, 22]
    ctx = DraftContext(torch.tensor([1, 2, 3, 11]), 1, SamplingParams(), None)
    la.propose(ctx, 5)
    la.observe_tree({i: 30 + j for j, i in enumerate(la.slots)})
    la.observe(0, 12)
    # slot 0's diagonal: first[0] -> 20 -> 30 became an n-gram keyed by its first token
    assert (20, 30) in la.pool[first[0]]
    assert la.window == [30, 31, 32]


def test_lookahead_proposes_pool_n_grams_that_start_with_the_newest_token():
    la = Lookahead(window=2, ngram=3, guesses=2, force_tree=True)
    ctx = DraftContext(torch.tensor([4, 5, 6, 9, 4]), 1, SamplingParams(), None)
    draft = la.propose(ctx, 4)
    parents = draft.parents.tolist()
    assert draft.tokens.tolist()[:2] == [5, 6] and parents[:2] == [-1, 0]  # the context's 3-gram 4 5 6
    assert len(parents) > 2  # and the window beside it
    # where trees are not exact (no runner here says they are): the n-gram alone, as a chain
    chain = Lookahead(window=2, ngram=3, guesses=2).propose(ctx, 4)
    assert chain.parents is None and chain.tokens.tolist() == [5, 6]


def test_the_eagle_tree_budget_follows_measured_pass_costs(monkeypatch):
    from engine.drafters import eagle as eagle_module
    from engine.drafters.eagle import _Costs

    clock = Clock()
    monkeypatch.setattr(eagle_module.time, "perf_counter", clock)
    probs = [0.9, 0.8, 0.7, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05, 0.02] + [0.01] * 14

    def measured(per_node):
        costs = _Costs()
        for n in (4, 8, 12, 16) * 3:  # passes of n nodes took 0.03 + per_node * n seconds
            costs.book()
            costs.proposed(n, sum(probs[:n]))
            costs.accepted(round(sum(probs[:n])))
            clock.now += 0.03 + per_node * n
        costs.book()
        return costs.budget(probs, 0.002)

    cheap, dear = measured(0.0005), measured(0.01)
    assert cheap >= 8 and dear <= 4 and cheap > dear
