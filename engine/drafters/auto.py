"""`auto`: each step, the drafter and draft length with the most expected tokens per expected second, or
nothing (a plain step) when no draft pays.

Members: prompt lookup, the model's earlier answers (`suffix.py`), the model's own phrases (`phrases.py`),
lookahead, every trained head found for the model (eagle, medusa), and the draft model where one is loaded. The earlier answers are offered where
the conversation's last tokens occur in them. Prompt lookup is split by the situation: how long the earlier match of the
conversation's last tokens is (1, 2-3, 4 or more; with no match it cannot draft). The phrases are offered
where prompt lookup's match is one token or none, and where they have a draft. Each of these choices keeps its
own `DraftLength`: the share of its drafts kept at each position, and the recent times of its steps by draft
length, timed by the decoder from one step's end to the next (the target's pass, the drafting, the
bookkeeping). A plain step is valued at the answer's live plain-step cost (`DraftContext.plain_s`). So a
member is compared with plain decoding and with the others at its own best length, not at a fixed one, and a
member whose best length is shorter than its drafts pays only for what it drafts.

Each choice drafts its full length for its first WARMUP steps (members with a pass of their own only
after HEADS_AFTER steps, one step in HEADS_EVERY); every EXPLORE_EVERY steps the least
recently used choice drafts again, so that a member that would now pay is found, and a prompt-lookup choice
that plain steps beat drafts one token every LOOKUP_RETRY of its steps (it costs next to nothing). Sampling with a seed,
timings must not shape the answer: auto then drafts with prompt lookup where it has a match and takes
plain steps elsewhere (not the phrases either: what they learned depends on the answers before).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch

from ..api.strategies import STRATEGIES, default_k
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft
from ..decoding.length import DraftLength
from ..decoding.tree import TokenTree, graft
from ..heads.store import read_info
from .draft_model import DraftModel
from .eagle import Eagle
from .lookahead import Lookahead
from .medusa import Medusa
from .phrases import Phrases, table_for
from .prompt_lookup import PromptLookup, continuation, longest_match
from .suffix import Suffix, index_for

HEAD_DRAFTERS = {Eagle.name: Eagle, Medusa.name: Medusa}  # the members that a trained head makes

EXPLORE_EVERY = 128
WARMUP = 3  # full-length drafts of each choice before its figures are trusted (DraftLength's prior helps)
# Members with a drafting pass of their own (lookahead, trained heads) cost more than a plain step while they
# are measured: they start measuring only after HEADS_AFTER steps of the drafter's life, one step in
# HEADS_EVERY, so a short first answer is not spent measuring them (prompt lookup costs next to nothing)
HEADS_AFTER = 24
HEADS_EVERY = 3
# A prompt-lookup choice that plain steps beat drafts one token again every LOOKUP_RETRY of its steps: its draft
# costs next to nothing (a pass of two rows), and without it a choice whose first few drafts were rejected kept
# those figures for good (on six of Spec-Bench's qa and summarization prompts auto took plain steps on 232 of
# the 337 steps where prompt lookup had a match, its figures for matches of 1 and of 2-3 tokens never updated)
LOOKUP_RETRY = 8
# A member with a pass of its own that another choice (or plain steps) beats drafts again after HEAD_RETRY of the
# steps it was ready for and passed over, while its figure is within RETRY_WITHIN of the best's (else after four
# times as many): a few early drafts that lost kept a draft model out for good (on the real 1.5B/0.5B pair it fell
# to 0.95 of plain steps' rate after 19 drafts of one token in a writing answer, and drafted nothing in the coding
# and arithmetic answers after it, where alone it ran at 1.4x and 1.2x)
HEAD_RETRY = 16
RETRY_WITHIN = 0.9


# a step's choice in words, for the tokens it drafted (a head's or lookahead's: its strategy's name)
CHOICE_WORDS = {"prompt-lookup:1": "prompt lookup (a match of 1 token)",
                "prompt-lookup:2-3": "prompt lookup (a match of 2-3 tokens)",
                "prompt-lookup:4+": "prompt lookup (a match of 4 tokens or more)",
                "phrases": "the model's own phrases",
                "suffix": "the model's earlier answers",
                "draft-model": "the draft model"}


def _lookup_bucket(n: int) -> str:
    return "prompt-lookup:1" if n <= 1 else "prompt-lookup:2-3" if n <= 3 else "prompt-lookup:4+"


class Auto(Drafter):
    name = "auto"
    description = STRATEGIES[name].description
    chooses_length = True  # the decoder gives it k and the step times (observe_step); it picks the length
    POLICY = ("_lengths", "models", "last_used", "passed_over", "steps")

    def __init__(self, members: dict | None = None, lookup_k: int = 8, use_lookup: bool = True,
                 phrases: Phrases | None = None, suffix: Suffix | None = None, lookup_branch: bool = True) -> None:
        self.lookup = PromptLookup()
        self.phrases = phrases  # the model's own phrases (None: not used)
        self.suffix = suffix  # the model's earlier answers (None: not used)
        self.use_lookup = use_lookup  # the user may keep auto from prompt lookup (option skip)
        self.lookup_branch = use_lookup and lookup_branch  # lookup's continuation in the draft model's passes
        self.lookup_k = lookup_k
        self.heads = dict(members or {})  # name -> (drafter, its own k): drafters other than prompt lookup
        self.aux_layers = tuple(sorted({i for d, _ in self.heads.values() for i in d.aux_layers}))
        self.models: dict[str, DraftLength] = {}  # choice -> its acceptance and step times
        self.last_used: dict[str, int] = {}
        self.passed_over: dict[str, int] = {}  # choice -> its steps that plain steps (a member: any other) won
        self.steps = 0
        self.chosen: str | None = None  # this step's choice ("none": a plain step)
        self.member = None
        self.plain_s: float | None = None  # the plain-step cost when this step was proposed

    @classmethod
    def build(cls, target, draft=None, heads=(), head=None, skip: str = "", phrases=None, draft_vocab=None,
              confident=True, tree=None, lookup=None, **options) -> "Auto":
        """`skip`: comma-separated strategies auto must not use (prompt-lookup, lookahead, eagle, medusa,
        phrases, draft-model); `phrases` false: the same as skipping them. A loaded draft model is a member
        (`draft_vocab`, `confident`, `tree`: its options, as draft-model takes them; `lookup` false: its passes
        without prompt lookup's continuation)."""
        left_out = {name.strip() for name in (skip or "").split(",") if name.strip()}
        members = {} if "lookahead" in left_out else {"lookahead": (Lookahead(), default_k("lookahead"))}
        if draft is not None and DraftModel.name not in left_out:
            model = DraftModel.build(target, draft, draft_vocab=draft_vocab, confident=confident, tree=tree)
            members[DraftModel.name] = (model, default_k(DraftModel.name))
        for folder in [*heads, *([head] if head else [])]:
            kind = read_info(Path(folder)).kind
            if kind not in members and kind not in left_out and kind in HEAD_DRAFTERS and target.uses_lean_forward:
                members[kind] = (HEAD_DRAFTERS[kind].build(target, draft, head=folder), default_k(kind))
        use_phrases = "phrases" not in left_out and (phrases is None or bool(phrases))
        return cls(members, use_lookup="prompt-lookup" not in left_out,
                   phrases=Phrases(table_for(target)) if use_phrases else None,
                   suffix=Suffix(index_for(target)) if "suffix" not in left_out else None,
                   lookup_branch=(lookup is None or bool(lookup)) and (tree is None or bool(tree)))

    @property
    def members(self) -> tuple[str, ...]:
        return ("none", *(("prompt-lookup",) if self.use_lookup else ()),
                *(("suffix",) if self.suffix is not None else ()),
                *(("phrases",) if self.phrases is not None else ()), *self.heads)

    def reset(self) -> None:
        """A new generation: the measurements so far stay."""
        for drafter, _ in self.heads.values():
            drafter.reset()
        if self.suffix is not None:
            self.suffix.reset()
        if self.phrases is not None:
            self.phrases.table.sync()
        self.chosen = self.member = None

    def forget(self) -> None:
        for drafter, _ in self.heads.values():
            drafter.forget()

    def _model(self, choice: str) -> DraftLength:
        if choice not in self.models:
            self.models[choice] = DraftLength(self.heads[choice][1] if choice in self.heads else self.lookup_k, WARMUP)
        return self.models[choice]

    def _pick(self, options: list[str], plain_s: float | None) -> tuple[str, int]:
        """(choice, draft length) for this step."""
        models = {o: self._model(o) for o in options}
        cold = [o for o in options if not models[o].warm]
        if cold and cold[0] not in self.heads:
            return cold[0], models[cold[0]].k
        if cold and self.steps >= HEADS_AFTER and self.steps % HEADS_EVERY == 0:
            return cold[0], models[cold[0]].k
        options = [o for o in options if models[o].warm]  # the others wait for their turn to be measured
        if options and self.steps % EXPLORE_EVERY == 0:
            stale = min(options, key=lambda o: self.last_used.get(o, 0))
            return stale, models[stale].k
        best, best_rate = "none", 1.0 / plain_s if plain_s else 0.0
        rates = {o: models[o].best(plain_s, least=1)[1] for o in options}
        for o in options:
            if rates[o] > best_rate:
                best, best_rate = o, rates[o]
        for o in options:  # the members with a pass of their own that lost this step: now and then, again
            if o in self.heads and o != best:
                self.passed_over[o] = self.passed_over.get(o, 0) + 1
                every = HEAD_RETRY if rates[o] >= RETRY_WITHIN * best_rate else 4 * HEAD_RETRY
                if self.passed_over[o] % every == 0:
                    return o, self._length(o, plain_s)
        if best == "none":
            cheap = next((o for o in options if o not in self.heads), None)
            if cheap is not None:
                self.passed_over[cheap] = self.passed_over.get(cheap, 0) + 1
                if self.passed_over[cheap] % LOOKUP_RETRY == 0:
                    return cheap, 1
            return best, 0
        return best, self._length(best, plain_s)

    def _length(self, choice: str, plain_s: float | None) -> int:
        """A chosen member's draft length: its measured best, or all of its k for a member that drafts only as far
        as it is confident (a draft model: each of its tokens is weighed against its cost as it is drafted)."""
        model = self.models[choice]
        if choice in self.heads and self.heads[choice][0].sizes_itself:
            return model.k
        return model.choose(plain_s) or model.best(plain_s, least=1)[0]

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self.steps += 1
        self.chosen = self.member = None
        self.plain_s = ctx.plain_s
        if k <= 0:
            return empty_draft()
        # the match is found once a step: prompt lookup's draft, when chosen, is what follows it
        n, start = longest_match(ctx.tokens.numpy(), self.lookup.max_n) if self.use_lookup else (0, 0)
        lookup = [_lookup_bucket(n)] if n else []
        if not ctx.timed:  # with a seed: the same steps whatever the timings
            choice, length = (lookup[0], self.lookup_k) if lookup else ("none", 0)
        else:
            # whether the phrases have a draft here: its first token says (the rest is looked up if chosen)
            has_phrase = self.phrases is not None and n <= 1 and self.phrases.draft(ctx, 1).numel() > 0
            earlier = self.suffix is not None and self.suffix.in_history(ctx.tokens)
            ready = [name for name, (drafter, _) in self.heads.items() if not drafter.waiting(ctx)]
            choice, length = self._pick([*lookup, *(["suffix"] if earlier else []), *(["phrases"] if has_phrase else []),
                                         *ready], ctx.plain_s)
        self.chosen = choice
        self.last_used[choice] = self.steps
        if choice == "none" or length == 0:
            return empty_draft()
        if choice == "phrases":
            return Draft(self.phrases.draft(ctx, min(k, length)))
        if choice == "suffix":
            self.member = self.suffix
            return self.suffix.propose(ctx, min(k, length))
        if choice in self.heads:
            self.member = self.heads[choice][0]
            draft = self.member.propose(ctx, min(k, length))
            if n and self.lookup_branch and self.member.sizes_itself:
                return self._with_lookup(draft, ctx, continuation(ctx.tokens, n, start, min(k, length)).tolist(),
                                         _lookup_bucket(n))
            return draft
        self.member = self.lookup
        return Draft(continuation(ctx.tokens, n, start, min(k, length)).clone())

    def _with_lookup(self, draft: Draft, ctx: DraftContext, branch: list[int], bucket: str) -> Draft:
        """The draft model's draft with prompt lookup's continuation as a branch of the same pass (greedy steps where
        tree passes decide as chains do): its nodes share the draft's where they agree, and a new node joins while
        the chance that lookup's drafts of this match length are kept that far (its measured figures) is worth a
        verify row. Where the draft model guesses free text and the conversation repeats itself, one pass holds
        both."""
        model = self.models.get(bucket)
        if (not branch or not ctx.params.greedy or not getattr(ctx.target, "exact_trees", False) or model is None
                or not model.warm):
            return draft
        row_cost = self.member.costs(ctx.plain_s)[1]
        tokens = draft.tokens.tolist()
        parents = draft.parents if draft.parents is not None else list(range(-1, len(tokens) - 1))
        # a new node only where lookup's drafts are kept that far often enough to be worth a row
        graft(tokens, parents, branch, lambda depth: model.reached[depth] >= 1 and model.kept_share(depth) >= row_cost)
        if len(tokens) == draft.tokens.numel():
            return draft
        return Draft(torch.tensor(tokens, dtype=torch.long), tree=TokenTree.of_draft(parents))

    @property
    def chose(self) -> str | None:
        if self.chosen is None or self.chosen == "none":
            return None
        return CHOICE_WORDS.get(self.chosen, self.chosen)

    @property
    def catch_up_s(self) -> float:
        return self.member.catch_up_s if self.member is not None else 0.0

    @property
    def learns_from_tree(self) -> bool:
        return self.member is not None and self.member.learns_from_tree

    def observe_tree(self, best: dict[int, int]) -> None:
        self.member.observe_tree(best)

    def observe_path(self, path: list[int]) -> None:
        if self.member is not None:
            self.member.observe_path(path)

    def observe(self, accepted: int, next_token: int) -> None:
        if self.member is not None:
            self.member.observe(accepted, next_token)
        for drafter, _ in self.heads.values():
            if drafter is not self.member:
                drafter.passed(accepted)

    def finished(self, tokens, prompt_len: int) -> None:
        """The answer ended: the members that learn from the model's answers learn it (whatever drafted it)."""
        for member in (self.suffix, self.phrases):
            if member is not None:
                member.finished(tokens, prompt_len)

    @contextmanager
    def unchanged(self) -> Iterator[None]:
        """Its own choices' figures and its members' come back as they were (Drafter.unchanged)."""
        with ExitStack() as stack:
            stack.enter_context(super().unchanged())
            for drafter, _ in self.heads.values():
                stack.enter_context(drafter.unchanged())
            yield

    @contextmanager
    def leaving_out(self, answers: list[list[int]]) -> Iterator[None]:
        """The members that learn from the model's answers leave these out (Drafter.leaving_out)."""
        with ExitStack() as stack:
            for member in (self.suffix, self.phrases):
                if member is not None:
                    stack.enter_context(member.leaving_out(answers))
            yield

    def observe_pass(self, rows: int, seconds: float) -> None:
        for drafter, _ in self.heads.values():
            drafter.observe_pass(rows, seconds)

    def observe_step(self, drafted: int, accepted: int, seconds: float) -> None:
        """The decoder's timing of the step this drafter proposed for: booked under its choice."""
        if self.chosen is not None and self.chosen != "none":
            self._model(self.chosen).observe(drafted, accepted, seconds, self.plain_s)
        self.chosen = self.member = None

    def summary(self, plain_s: float | None = None) -> dict[str, float]:
        """Expected tokens per second of each choice at its best length (for reports)."""
        return {o: round(m.best(plain_s)[1], 2) for o, m in sorted(self.models.items()) if m.warm}
