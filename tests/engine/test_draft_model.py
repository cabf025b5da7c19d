"""The draft model drafts what pays: tokens it is confident of, from a cut vocabulary, learning from what the target
kept; its answers stay the target's own, alone and as a member of auto."""

import pytest
import torch

from specula.engine.api.types import DecodeConfig, SamplingParams
from specula.engine.decoding.drafter import Draft, DraftContext, PassCosts
from specula.engine.decoding.loop import generate
from specula.engine.drafters import build_drafter
from specula.engine.drafters.auto import Auto
from specula.engine.drafters.draft_model import DraftModel, draft_vocab_for
from specula.engine.drafters.model_drafter import READ_WINDOW, Calibration, ModelDrafter
from specula.engine.api.strategies import DRAFT_VOCAB
from specula.engine.api.errors import SpeculaError
from tests.support.tiny import loaded, native, perturbed, tiny_model


class ScriptedRunner:
    """A drafting model whose next token is always `token` with probability `sure` at the positions in `sure_at`
    and 0.1 elsewhere (vocabulary of 16)."""

    max_len = 1000

    def __init__(self, sure_at: set[int], sure: float = 0.999) -> None:
        self.sure_at, self.sure = sure_at, sure
        self.length = 0

    def truncate(self, length: int) -> None:
        self.length = length

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += tokens.shape[0]
        p = self.sure if self.length in self.sure_at else 0.1
        probs = torch.full((16,), (1 - p) / 15)
        probs[3] = p
        return probs.log()[None]


def _ctx(tokens: int, plain_s: float, timed: bool = True) -> DraftContext:
    return DraftContext(torch.arange(tokens) % 16, tokens, SamplingParams(temperature=0.0), None, None, plain_s, timed)


def test_the_draft_model_drafts_its_full_length_where_it_is_sure_and_stops_at_an_unsure_token():
    sure = ModelDrafter(ScriptedRunner(sure_at=set(range(5, 9))), 16)
    draft = sure.propose(_ctx(5, plain_s=10.0), 8)  # positions 5-8 sure, then 0.1: left out
    assert draft.tokens.tolist() == [3, 3, 3, 3, 3]  # the fifth (p = 0.1) still worth a verify row after four sure ones
    unsure = ModelDrafter(ScriptedRunner(sure_at=set()), 16)
    assert unsure.propose(_ctx(5, plain_s=10.0), 8).tokens.tolist() == [3]  # one guess, then nothing worth a row
    always = ModelDrafter(ScriptedRunner(sure_at=set()), 16, confident=False)
    assert always.propose(_ctx(5, plain_s=10.0), 8).tokens.tolist() == [3] * 8
    seeded = ModelDrafter(ScriptedRunner(sure_at=set()), 16)  # sampling with a seed: timings must not shape it
    assert seeded.propose(_ctx(5, plain_s=10.0, timed=False), 8).tokens.shape[0] == 8


def test_a_draft_token_that_costs_more_than_it_is_likely_to_win_is_not_drafted():
    drafter = ModelDrafter(ScriptedRunner(sure_at=set(range(5, 20)), sure=0.9), 16)
    # a forward that costs as much as a plain step: a second token (kept 9 times in 10 after a kept one 0.7 of
    # the time) is not worth it
    drafter.token_s = 1.0
    assert drafter.propose(_ctx(5, plain_s=1.0), 8).tokens.shape[0] == 1
    drafter.reset()
    drafter.token_s = 0.01  # a hundredth of a step: it drafts on while the chain is likely to hold
    assert drafter.propose(_ctx(5, plain_s=1.0), 8).tokens.shape[0] >= 4


def test_the_calibration_learns_how_often_the_target_keeps_what_the_drafter_was_sure_of():
    cal = Calibration()
    assert cal.share(0.999) > 0.95 and cal.share(0.1) < 0.2  # the drafter's own probability to start from
    for _ in range(100):
        cal.observe([0.999, 0.999, 0.999], 0)  # the first rejected each time: the others were never judged
    assert cal.share(0.999) < 0.1
    before = cal.share(0.5)
    cal.observe([0.5], 1)
    assert cal.share(0.5) > before


def test_the_share_kept_after_a_kept_token_follows_what_the_target_kept():
    drafter = ModelDrafter(ScriptedRunner(sure_at=set()), 16)
    start = drafter.after_kept
    for _ in range(30):
        drafter._probs = [0.9, 0.9, 0.9, 0.9]
        drafter.observe(4, 0)  # every token kept
    assert drafter.after_kept > start + 0.15
    for _ in range(60):
        drafter._probs = [0.9, 0.9, 0.9, 0.9]
        drafter.observe(1, 0)  # the second rejected
    assert drafter.after_kept < start


def test_the_default_draft_vocabulary_is_cut_only_for_large_vocabularies():
    assert draft_vocab_for(151_936, None) == DRAFT_VOCAB
    assert draft_vocab_for(128_256, None) == DRAFT_VOCAB  # Llama 3's
    assert draft_vocab_for(49_152, None) == 0  # SmolLM2's: every id
    assert draft_vocab_for(151_936, 0) == 0 and draft_vocab_for(151_936, 4096) == 4096
    assert draft_vocab_for(1000, 5000) == 0
    with pytest.raises(SpeculaError):
        draft_vocab_for(1000, -1)


@pytest.mark.parametrize("step", ["compiled", "eager"])
def test_a_cut_vocabulary_gives_the_first_ids_logits(ops, step):
    """The compiled step reads only the first rows of a file's LM head; the eager forward cuts its logits: the
    same numbers as the first columns of the whole vocabulary's."""
    target = native(tiny_model(vocab=64, layers=2, seed=3), head="Q8_0")
    target.step = step
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0))
    whole, cut = target.new_runner(), target.new_runner()
    cut.limit_vocab(20)  # a whole tile of 16 outputs: rounded up to 32
    assert cut.head_rows == 32
    for runner in (whole, cut):
        runner.forward(ids[:1])
    full = torch.cat([whole.forward(ids[i : i + 1]) for i in range(1, 12)])
    part = torch.cat([cut.forward(ids[i : i + 1]) for i in range(1, 12)])
    assert part.shape == (11, 32)
    assert torch.equal(part, full[:, :32])
    if step == "compiled":
        assert cut.compiled and cut.head_product(cut.fast.lm_head).out_features == 32


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_answers_with_a_cut_draft_vocabulary_and_draft_model_in_auto_are_the_targets_own():
    target = loaded(tiny_model(vocab=64, layers=3, seed=0))
    draft = loaded(perturbed(target.model, scale=0.05))
    auto = build_drafter("auto", target, draft, draft_vocab=32)
    assert "draft-model" in auto.members and isinstance(auto.heads["draft-model"][0], DraftModel)
    assert "draft-model" not in build_drafter("auto", target, draft, skip="draft-model").members
    assert "draft-model" not in Auto.build(target, None).members
    gen = torch.Generator().manual_seed(7)
    for trial in range(6):
        prompt = torch.randint(0, 64, (int(torch.randint(2, 20, (1,), generator=gen)),), generator=gen).tolist()
        plain = list(generate(target.new_runner(), build_drafter("none", target), prompt,
                              DecodeConfig(max_new_tokens=60)))[-1]
        for strategy, options in (("draft-model", {"draft_vocab": 32}), ("draft-model", {"confident": False}),
                                  ("auto", {})):
            drafter = auto if strategy == "auto" else build_drafter(strategy, target, draft, **options)
            spec = list(generate(target.new_runner(), drafter, prompt, DecodeConfig(k=1 + trial, max_new_tokens=60)))[-1]
            assert spec.token_ids == plain.token_ids, (strategy, options, prompt)
    assert auto.models["draft-model"].drafting_steps > 0  # auto had the draft model draft


def test_what_a_verify_row_costs_is_fitted_from_the_passes_seen():
    passes = PassCosts()
    assert passes.row_s() is None and passes.plain_s() is None
    for _ in range(5):
        passes.add(1, 0.050)
    assert passes.row_s() is None and passes.plain_s() == pytest.approx(0.050)  # one size only: no slope yet
    for rows in (2, 4, 8, 9, 3):
        passes.add(rows, 0.050 + 0.012 * (rows - 1))
    assert passes.row_s() == pytest.approx(0.012) and passes.plain_s() == pytest.approx(0.050)
    drafter = ModelDrafter(ScriptedRunner(sure_at=set()), 16)
    drafter.passes = passes
    drafter.token_s = 0.010
    assert drafter.costs(None) == pytest.approx((0.2, 0.24))  # in plain steps of the fitted line's
    assert drafter.costs(0.1) == pytest.approx((0.1, 0.12))


def test_the_loop_tells_a_drafter_every_verify_pass_rows():
    target = loaded(tiny_model(vocab=64, layers=2, seed=0))
    drafter = build_drafter("draft-model", target, loaded(perturbed(target.model, scale=0.05)))
    seen = []
    drafter.observe_pass = lambda rows, seconds: seen.append((rows, seconds))
    finished = list(generate(target.new_runner(), drafter, [1, 2, 3], DecodeConfig(k=3, max_new_tokens=30)))[-1]
    assert len(seen) == finished.totals.steps and all(s > 0 for _, s in seen)
    assert sum(rows - 1 for rows, _ in seen) == finished.totals.drafted


def test_the_draft_model_waits_to_read_a_new_prompt_until_the_answer_is_likely_to_win_it_back():
    drafter = ModelDrafter(ScriptedRunner(sure_at=set()), 16)
    greedy = SamplingParams(temperature=0.0)

    def ctx(length: int, prompt: int) -> DraftContext:
        return DraftContext(torch.arange(length) % 16, prompt, greedy, None, None, 10.0, True)

    assert drafter.waiting(ctx(103, 100)) and drafter.propose(ctx(103, 100), 4).tokens.numel() == 0  # 3 answered
    assert drafter.runner.length == 0  # nothing read
    assert drafter.waiting(ctx(160, 100))  # 60 answered: about 60 more to come would not pay a read of 160
    assert not drafter.waiting(ctx(220, 100))  # 120 answered: 120 more would
    assert drafter.propose(ctx(220, 100), 4).tokens.numel() > 0 and drafter.runner.length >= 220  # all of it read
    drafter.reset()  # a new answer whose conversation the cache holds: no read to wait for
    assert not drafter.waiting(ctx(222, 221))
    drafter.read_s = 0.1  # reads measured at a hundredth of a plain step a position: worth it sooner
    other = DraftContext(torch.arange(60) % 16 + 1, 40, greedy, None, None, 10.0, True)  # 60 new positions
    assert not drafter.waiting(other)  # 20 answered win back 0.6 plain steps of reading


def test_a_long_read_takes_the_latest_positions_only():
    drafter = ModelDrafter(ScriptedRunner(sure_at=set()), 16)
    greedy = SamplingParams(temperature=0.0)
    drafter.propose(DraftContext(torch.arange(900) % 16, 700, greedy, None, None, 10.0, True), 1)
    assert drafter.runner.length == READ_WINDOW and drafter.offset == 900 - READ_WINDOW
    drafter.propose(DraftContext(torch.arange(902) % 16, 700, greedy, None, None, 10.0, True), 1)
    assert drafter.runner.length == READ_WINDOW + 2  # the next step feeds what is new only


class TwoChoiceRunner(ScriptedRunner):
    """A drafting model that gives token 3 probability `first` and token 5 `second` at every position."""

    def __init__(self, first: float = 0.7, second: float = 0.25) -> None:
        super().__init__(sure_at=set())
        self.first, self.second = first, second

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.length += tokens.shape[0]
        probs = torch.full((16,), (1 - self.first - self.second) / 14)
        probs[3], probs[5] = self.first, self.second
        return probs.log()[None]


class TreeTarget:
    exact_trees = True  # its tree passes decide as chain passes would


def _tree_ctx(params: SamplingParams, target=TreeTarget()) -> DraftContext:
    return DraftContext(torch.arange(5) % 16, 5, params, torch.Generator().manual_seed(0), target, 10.0, True)


def test_next_choices_join_the_chain_as_leaves_where_a_verify_row_is_cheap_and_not_where_it_is_dear():
    greedy = SamplingParams(temperature=0.0)
    cheap = ModelDrafter(TwoChoiceRunner(), 16)
    cheap.costs = lambda plain_s: (0.01, 0.02)  # a forward a hundredth of a step, a verify row a fiftieth
    draft = cheap.propose(_tree_ctx(greedy), 4)
    chain = [i for i, parent in enumerate(draft.parents) if i == 0 or parent == i - 1]
    assert draft.tree is not None and len(chain) >= 2
    assert [draft.tokens[i].item() for i in chain] == [3] * len(chain)  # the first choices, each continuing the last
    leaves = [i for i in range(len(draft.parents)) if i not in chain]
    assert leaves and all(draft.tokens[i].item() == 5 for i in leaves)  # the next choice, beside a chain token
    assert draft.parents[leaves[0]] == -1  # the first beside the chain's first token
    assert all(i not in draft.parents for i in leaves)  # leaves: no forward of the drafter continues them
    dear = ModelDrafter(TwoChoiceRunner(), 16)
    dear.costs = lambda plain_s: (0.01, 0.5)  # a row half a step (a 0.25 chance of winning a token is not worth it)
    assert dear.propose(_tree_ctx(greedy), 4).tree is None
    assert cheap.propose(_tree_ctx(greedy, target=None), 4).tree is None  # a target whose trees are not exact
    sampled = cheap.propose(_tree_ctx(SamplingParams(temperature=0.8)), 4)
    assert sampled.tree is None and sampled.q is not None  # sampling: a chain carrying the drafter's distribution


def test_what_the_target_kept_of_a_tree_teaches_the_chain_and_the_next_choices_apart():
    greedy = SamplingParams(temperature=0.0)
    drafter = ModelDrafter(TwoChoiceRunner(), 16)
    drafter.costs = lambda plain_s: (0.01, 0.02)
    draft = drafter.propose(_tree_ctx(greedy), 4)
    first_leaf = next(i for i, parent in enumerate(draft.parents) if parent == -1 and i > 0)
    chain_share, leaf_share = drafter.calibration.share(0.7), drafter.next_choices.share(0.25 / 0.3)
    drafter.observe_path([first_leaf])  # the target took the next choice at the first position
    drafter.observe(1, 0)
    assert drafter.calibration.share(0.7) < chain_share  # the chain's first token was rejected
    assert drafter.next_choices.share(0.25 / 0.3) > leaf_share  # and the leaf beside it kept
    drafter.propose(_tree_ctx(greedy), 4)
    leaf_share = drafter.next_choices.share(0.25 / 0.3)
    drafter.observe(0, 0)  # neither: the target's own token
    assert drafter.next_choices.share(0.25 / 0.3) < leaf_share
    drafter.propose(_tree_ctx(greedy), 4)
    chain_share, leaf_share = drafter.calibration.share(0.7), drafter.next_choices.share(0.25 / 0.3)
    drafter.observe_path([0, 1])
    drafter.observe(2, 0)  # two chain tokens kept: a leaf beside a kept token was never in question
    assert drafter.calibration.share(0.7) > chain_share


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_answers_from_the_draft_models_trees_are_the_targets_own(ops, monkeypatch):
    """On the compiled step (where tree passes decide as chains do) with every leaf worth its row."""
    monkeypatch.setattr(ModelDrafter, "costs", lambda self, plain_s: (0.0, 1e-4))
    target = loaded(tiny_model(vocab=64, layers=3, seed=0))
    target.step = "compiled"
    draft = loaded(perturbed(target.model, scale=0.3))
    gen = torch.Generator().manual_seed(11)
    branches = []
    for trial in range(5):
        prompt = torch.randint(0, 64, (int(torch.randint(2, 20, (1,), generator=gen)),), generator=gen).tolist()
        plain = list(generate(target.new_runner(), build_drafter("none", target), prompt,
                              DecodeConfig(max_new_tokens=50)))[-1]
        for strategy in ("draft-model", "auto"):
            events = list(generate(target.new_runner(), build_drafter(strategy, target, draft), prompt,
                                   DecodeConfig(k=2 + trial, max_new_tokens=50)))
            assert events[-1].token_ids == plain.token_ids, (strategy, prompt)
            branches += [e.tokens[0].branch for e in events if getattr(e, "tokens", None) and e.tokens[0].branch]
    assert branches  # the passes were trees
    assert any(any(rank != "1" for rank in b.split("kept path ")[1].split("·")) for b in branches
               if "none" not in b)  # and the target kept a next choice in some


def test_a_draft_model_times_a_read_when_it_is_made_and_keeps_nothing_of_it():
    target = loaded(tiny_model(vocab=64, layers=2, seed=0))
    drafter = build_drafter("draft-model", target, loaded(perturbed(target.model, scale=0.05)))
    assert drafter.read_s is not None and drafter.read_s > 0  # the first answer's wait weighs a measured cost
    assert drafter.runner.length == 0 and drafter.cached == []
    finished = list(generate(target.new_runner(), drafter, [1, 2, 3], DecodeConfig(k=3, max_new_tokens=20)))[-1]
    plain = list(generate(target.new_runner(), build_drafter("none", target), [1, 2, 3],
                          DecodeConfig(max_new_tokens=20)))[-1]
    assert finished.token_ids == plain.token_ids


class Recording(ModelDrafter):
    """The draft model, recording the lengths the loop asks of it."""

    def propose(self, ctx, k):
        room = 60 - (ctx.tokens.shape[0] - ctx.prompt_len) - 1  # the answer's budget left after this step's token
        self.asked.append((k, min(5, room)))
        return super().propose(ctx, k)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_loop_asks_a_draft_model_for_its_whole_length_or_for_nothing():
    """Its length policy says whether to draft at all: the draft model sizes its drafts itself, token by token, and a
    draft cut to one token pays for the draft model's read of the newest positions with one token at most (a draft
    model held to one-token drafts by its first figures drafted in 12 of 246 steps on the real pair)."""
    target = loaded(tiny_model(vocab=64, layers=2, seed=0))
    draft = loaded(perturbed(target.model, scale=0.5))
    drafter = Recording(draft.new_runner(), 64)
    drafter.asked = []
    assert drafter.sizes_itself
    for prompt in ([1, 2, 3], [4, 5, 6, 7], [9, 8]):
        list(generate(target.new_runner(), drafter, prompt, DecodeConfig(k=5, max_new_tokens=60)))
    assert len(drafter.asked) > 3
    assert all(k == whole for k, whole in drafter.asked)  # its whole length, or what the answer's budget leaves
    fixed = Recording(draft.new_runner(), 64, confident=False)
    fixed.asked = []
    assert not fixed.sizes_itself


def test_a_read_timed_while_the_machine_was_busy_does_not_keep_the_draft_model_waiting_for_good():
    drafter = ModelDrafter(ScriptedRunner(sure_at=set()), 16)
    greedy = SamplingParams(temperature=0.0)
    drafter.read_s = 50.0  # five plain steps a position: timed beside other work
    long_answer = DraftContext(torch.arange(400) % 16, 100, greedy, None, None, 10.0, True)  # 300 answered
    assert not drafter.waiting(long_answer)  # valued at READ_COST a position at most


class Member(ModelDrafter):
    """A draft model that always drafts [7, 8], at a fiftieth of a step a verify row."""

    def __init__(self) -> None:
        super().__init__(ScriptedRunner(sure_at=set()), 16)

    def propose(self, ctx, k):
        return Draft(torch.tensor([7, 8]))

    def costs(self, plain_s):
        return 0.01, 0.02


def _lookup_figures(auto: Auto, bucket: str, kept: int) -> None:
    for _ in range(8):  # lookup's drafts of this match length: four tokens each, `kept` of them kept
        auto._model(bucket).observe(4, kept, 0.012, 0.010)


def test_auto_puts_prompt_lookups_continuation_into_the_draft_models_pass_where_it_pays():
    tokens = torch.tensor([5, 6, 7, 9, 10, 11, 5, 6])  # "5 6" came before, followed by 7 9 10 11
    ctx = DraftContext(tokens, 2, SamplingParams(temperature=0.0), None, TreeTarget(), 0.010, True)
    auto = Auto({"draft-model": (Member(), 8)})
    auto.member = auto.heads["draft-model"][0]
    _lookup_figures(auto, "prompt-lookup:2-3", kept=4)
    draft = auto._with_lookup(Draft(torch.tensor([7, 8])), ctx, [7, 9, 10, 11], "prompt-lookup:2-3")
    assert draft.tokens.tolist() == [7, 8, 9, 10, 11]  # 7 shared, then lookup's 9 10 11 beside the draft's 8
    assert draft.parents == [-1, 0, 0, 2, 3]
    seldom = Auto({"draft-model": (Member(), 8)})
    seldom.member = seldom.heads["draft-model"][0]
    _lookup_figures(seldom, "prompt-lookup:2-3", kept=0)  # lookup's drafts of such matches are never kept
    assert seldom._with_lookup(Draft(torch.tensor([7, 8])), ctx, [7, 9, 10, 11], "prompt-lookup:2-3").tree is None
    sampled = DraftContext(tokens, 2, SamplingParams(temperature=0.8), None, TreeTarget(), 0.010, True)
    assert auto._with_lookup(Draft(torch.tensor([7, 8])), sampled, [7, 9, 10, 11], "prompt-lookup:2-3").tree is None
    member = auto.member  # the draft model learns from its own nodes of the kept path only
    member._probs, member._leaves = [0.9, 0.9], []
    before = member.calibration.share(0.9)
    member.observe_path([0, 2, 3])  # 7, then lookup's 9 and 10
    member.observe(3, 11)
    assert member.calibration.share(0.9) < before  # its first token kept, its second (8) rejected


@pytest.mark.usefixtures("one_torch_thread")
def test_greedy_answers_with_lookups_branch_in_the_draft_models_passes_are_the_targets_own(ops, monkeypatch):
    from specula.engine.drafters import auto as auto_module

    monkeypatch.setattr(ModelDrafter, "costs", lambda self, plain_s: (0.0, 1e-4))
    monkeypatch.setattr(auto_module, "HEADS_AFTER", 0)
    added = []
    original = Auto._with_lookup

    def counting(self, draft, ctx, branch, bucket):
        merged = original(self, draft, ctx, branch, bucket)
        added.append(merged.tokens.numel() - draft.tokens.numel())
        return merged

    monkeypatch.setattr(Auto, "_with_lookup", counting)
    target = loaded(tiny_model(vocab=64, layers=3, seed=1))
    target.step = "compiled"
    draft = loaded(perturbed(target.model, scale=0.3))
    gen = torch.Generator().manual_seed(5)
    auto = build_drafter("auto", target, draft)
    for trial in range(4):
        tail = torch.randint(0, 64, (6,), generator=gen).tolist()
        prompt = tail * 3 + [int(torch.randint(0, 64, (1,), generator=gen))]  # repeated text: lookup finds matches
        plain = list(generate(target.new_runner(), build_drafter("none", target), prompt,
                              DecodeConfig(max_new_tokens=60)))[-1]
        spec = list(generate(target.new_runner(), auto, prompt, DecodeConfig(k=6, max_new_tokens=60)))[-1]
        assert spec.token_ids == plain.token_ids, prompt
    assert any(n > 0 for n in added)  # some passes held lookup's branch beside the draft model's nodes
