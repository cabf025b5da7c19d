"""auto's choice from measured speed, and lookahead's Jacobi window and n-gram pool, on scripted steps."""

import pytest
import torch

from specula.engine.api.types import SamplingParams
from specula.engine.decoding.drafter import Draft, DraftContext, Drafter
from specula.engine.drafters import auto as auto_module
from specula.engine.drafters.auto import Auto
from specula.engine.drafters.lookahead import Lookahead


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Guesser(Drafter):
    """A head stand-in that always drafts four tokens (fewer when k is smaller)."""

    name = "guesser"

    def __init__(self):
        self.lengths = []

    def propose(self, ctx, k):
        self.lengths.append(min(k, 4))
        return Draft(torch.tensor([1, 2, 3, 4][:k]))


def drive(auto, steps, cost, kept, tokens=(5, 6, 7, 8, 9), timed=True):
    """Run `steps` scripted steps as the decoder would: a step that drafts n tokens takes cost(n) seconds
    and keeps the first kept[choice] of them; a plain step costs cost(0), the live plain cost."""
    ctx = DraftContext(torch.tensor(tokens), 2, SamplingParams(), None, plain_s=cost(0), timed=timed)
    chosen = []
    for _ in range(steps):
        draft = auto.propose(ctx, 8)
        chosen.append(auto.chosen)
        n = draft.tokens.shape[0]
        accepted = min(n, kept.get(auto.chosen, 0))
        auto.observe(accepted, 0)
        auto.observe_step(n, accepted, cost(n))
    return chosen


@pytest.fixture
def heads_at_once(monkeypatch):
    """Members with a pass of their own measured from the first step (as in a drafter's later answers)."""
    monkeypatch.setattr(auto_module, "HEADS_AFTER", 0)
    monkeypatch.setattr(auto_module, "HEADS_EVERY", 1)


def test_a_new_auto_measures_its_costly_members_only_later_and_between_other_steps():
    guesser = Guesser()
    auto = Auto({"eagle": (guesser, 6)})
    chosen = drive(auto, 60, lambda n: 0.030 + 0.002 * n, {"eagle": 4})
    assert chosen[: auto_module.HEADS_AFTER - 1] == ["none"] * (auto_module.HEADS_AFTER - 1)  # a short answer
    warming = [i + 1 for i, c in enumerate(chosen) if c == "eagle"][: auto_module.WARMUP]
    assert warming[0] >= auto_module.HEADS_AFTER and all(step % auto_module.HEADS_EVERY == 0 for step in warming)
    assert chosen[-10:] == ["eagle"] * 10  # once measured, it is used where it pays


def test_auto_drafts_with_the_fastest_member_at_its_best_length(heads_at_once):
    guesser = Guesser()
    auto = Auto({"eagle": (guesser, 6)})
    # eagle keeps 2 of its 4 guesses; a plain step costs 30 ms and each drafted row 5 ms more: 2 drafts give
    # 3 tokens in 40 ms (75/s), 4 drafts 3 tokens in 50 ms (60/s), a plain step 1 in 30 ms (33/s)
    steps = 2 * auto_module.EXPLORE_EVERY
    chosen = drive(auto, steps, lambda n: 0.030 + 0.005 * n, {"eagle": 2})
    assert chosen[:6] == ["eagle"] * 6  # measured first, at its own length
    assert chosen.count("eagle") == steps  # drafting pays here: no plain steps
    assert guesser.lengths[6:].count(2) >= 0.8 * (steps - 6)  # mostly the best length, the full one now and then
    assert 4 in guesser.lengths[6:]


def test_auto_falls_back_to_plain_steps_when_drafting_does_not_pay(heads_at_once):
    guesser = Guesser()
    auto = Auto({"eagle": (guesser, 6)})
    chosen = drive(auto, 64, lambda n: 0.030 + 0.005 * n, {"eagle": 0})
    assert chosen[6:].count("none") >= 56
    assert len(guesser.lengths) <= 8


class Later(dict):
    """What a member's drafts keep: nothing for its first `after` drafts, then `kept`."""

    def __init__(self, name: str, after: int, kept: int) -> None:
        super().__init__()
        self.name, self.after, self.kept, self.asked = name, after, kept, 0

    def get(self, choice, default=0):
        if choice != self.name:
            return default
        self.asked += 1
        return self.kept if self.asked > self.after else 0


def test_a_member_that_lost_early_is_tried_again_and_taken_once_it_pays(heads_at_once):
    guesser = Guesser()
    auto = Auto({"eagle": (guesser, 6)})
    # its first five drafts keep nothing (plain steps then win), the later ones all four: rows are cheap, so a
    # draft that keeps nothing costs little more than a plain step and it is tried again soon
    kept = Later("eagle", after=5, kept=4)
    chosen = drive(auto, 120, lambda n: 0.030 + 0.001 * n, kept)
    lost = chosen.index("none", 6)
    assert "eagle" in chosen[lost : lost + 2 * auto_module.HEAD_RETRY + 1]  # tried again
    assert chosen[-20:].count("eagle") >= 18  # and taken where it pays now
    without = Auto({"eagle": (Guesser(), 6)})
    never = drive(without, 120, lambda n: 0.030 + 0.006 * n, Later("eagle", after=5, kept=0))
    # a member that keeps nothing and costs a fifth of a step more than a plain one: tried again rarely
    assert never[20:].count("eagle") <= 120 // (4 * auto_module.HEAD_RETRY) + 1


class Sizing(Guesser):
    """A member that drafts only as far as it is confident: it keeps the k it was asked for."""

    sizes_itself = True

    def propose(self, ctx, k):
        self.lengths.append(k)
        return Draft(torch.tensor([1, 2, 3, 4, 5, 6, 7, 8][:min(k, 2)]))


def test_auto_asks_a_member_that_sizes_its_own_drafts_for_its_whole_length(heads_at_once):
    sizing, fixed = Sizing(), Guesser()
    drive(Auto({"draft-model": (sizing, 6)}), 40, lambda n: 0.030 + 0.004 * n, {"draft-model": 1})
    drive(Auto({"eagle": (fixed, 6)}), 40, lambda n: 0.030 + 0.004 * n, {"eagle": 1})
    assert sizing.lengths and set(sizing.lengths) == {6}
    assert min(fixed.lengths) < 4  # a member that drafts what it is asked for gets its measured best length


def test_auto_uses_prompt_lookup_where_the_context_repeats(heads_at_once):
    auto = Auto({"eagle": (Guesser(), 6)})
    tokens = (1, 2, 3, 4, 9, 1, 2, 3)  # "1 2 3" occurred before: prompt lookup drafts "4 9 1 2 3"
    chosen = drive(auto, 40, lambda n: 0.030 + 0.002 * n, {"prompt-lookup:2-3": 3, "eagle": 0}, tokens)
    assert chosen[-20:] == ["prompt-lookup:2-3"] * 20


def test_a_lookup_choice_that_plain_steps_beat_drafts_one_token_now_and_then_and_is_used_once_it_pays(heads_at_once):
    """Its first drafts all rejected, a prompt-lookup choice loses to plain steps, but drafts a single token
    every LOOKUP_RETRY of its steps: when the conversation's repeats start to be kept, auto finds it long
    before its every-EXPLORE_EVERY-steps exploration would. A head is retried only every HEAD_RETRY of its passed-over
    steps (its draft costs a pass of its own)."""
    guesser = Guesser()
    auto = Auto({"eagle": (guesser, 6)})
    tokens = (1, 2, 3, 4, 9, 1, 2, 3)
    cost = lambda n: 0.030 + 0.002 * n  # noqa: E731
    chosen = drive(auto, 48, cost, {"prompt-lookup:2-3": 0, "eagle": 0}, tokens)
    lookup = [i for i, c in enumerate(chosen) if c == "prompt-lookup:2-3"]
    late = [i for i in lookup if i >= 12]
    assert chosen[-8:].count("none") >= 6 and 2 <= len(late) <= 48 // auto_module.LOOKUP_RETRY + 1
    eagle_drafts = len(guesser.lengths)
    chosen = drive(auto, 40, cost, {"prompt-lookup:2-3": 3, "eagle": 0}, tokens)  # now its drafts are kept
    assert chosen[-16:] == ["prompt-lookup:2-3"] * 16
    assert auto.steps < auto_module.EXPLORE_EVERY  # found by the retries, not by the stale-choice exploration
    assert len(guesser.lengths) - eagle_drafts <= 40 // auto_module.HEAD_RETRY + 1


def test_with_a_seed_auto_chooses_the_same_steps_whatever_the_timings():
    def run(cost):
        return drive(Auto({"eagle": (Guesser(), 6)}), 20, cost, {"prompt-lookup:2-3": 3}, (1, 2, 3, 9, 1, 2, 3), False)

    assert run(lambda n: 0.030 + 0.005 * n) == run(lambda n: 0.001 + 0.1 * n) == ["prompt-lookup:2-3"] * 20
    assert drive(Auto(), 5, lambda n: 0.03, {}, (5, 6, 7), False) == ["none"] * 5  # no match: plain steps


def test_auto_leaves_out_what_the_user_keeps_it_from():
    auto = Auto.build(None, skip="prompt-lookup, lookahead, phrases, suffix")
    assert auto.members == ("none",)
    tokens = (1, 2, 3, 4, 9, 1, 2, 3)  # prompt lookup would match here
    assert set(drive(auto, 12, lambda n: 0.030 + 0.002 * n, {"prompt-lookup:2-3": 3}, tokens)) == {"none"}
    assert Auto.build(None, skip="").members == ("none", "prompt-lookup", "suffix", "phrases", "lookahead")


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
    parents = draft.parents
    assert draft.tokens.tolist()[:2] == [5, 6] and parents[:2] == [-1, 0]  # the context's 3-gram 4 5 6
    assert len(parents) > 2  # and the window beside it
    # where trees are not exact (no runner here says they are): the n-gram alone, as a chain
    chain = Lookahead(window=2, ngram=3, guesses=2).propose(ctx, 4)
    assert chain.parents is None and chain.tokens.tolist() == [5, 6]


def test_the_eagle_tree_budget_follows_measured_pass_costs(monkeypatch):
    from specula.engine.drafters import eagle as eagle_module
    from specula.engine.drafters.eagle import _Costs

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
