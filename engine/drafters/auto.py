"""`auto`: each step, the drafter that has been fastest so far in this situation drafts, or nothing does.

Members: prompt lookup, lookahead, and every trained head found for the model (eagle, medusa). The situation is
whether the conversation's last tokens occur earlier (and how long that match is), which is when prompt
lookup can draft at all and how well it does. For each choice auto keeps decayed sums of the tokens a
step produced and the seconds it took (from one proposal to the next, so the target's pass, the
drafting and the bookkeeping all count), and picks the best tokens per second, with plain decoding
(`none`) always one of the choices: a drafter that costs more than it wins is dropped in favour of
plain steps, so auto stays about as fast as `none` when nothing pays. Each choice is tried a few times
first, and every 32nd step re-measures the least recently measured one.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..strategies import STRATEGIES
from .base import Draft, DraftContext, empty_draft
from .prompt_lookup import PromptLookup, longest_match

DECAY = 0.9  # weight of the past per new measurement of the same choice
TRIES = 2  # measurements of each choice before auto trusts its numbers
EXPLORE_EVERY = 128


class _Rate:
    def __init__(self) -> None:
        self.tokens = self.seconds = 0.0
        self.count = 0
        self.last_used = 0

    def add(self, tokens: int, seconds: float, step: int) -> None:
        self.tokens = DECAY * self.tokens + tokens
        self.seconds = DECAY * self.seconds + seconds
        self.count += 1
        self.last_used = step

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _lookup_bucket(n: int) -> str:
    return "prompt-lookup:1" if n <= 1 else "prompt-lookup:2-3" if n <= 3 else "prompt-lookup:4+"


class Auto:
    name = "auto"
    description = STRATEGIES[name].description

    def __init__(self, members: dict | None = None, lookup_k: int = 8) -> None:
        self.lookup = PromptLookup()
        self.lookup_k = lookup_k
        self.heads = dict(members or {})  # name -> (drafter, its own k): drafters other than prompt lookup
        self.rates: dict[str, _Rate] = {}
        self.steps = 0
        self.chosen: str | None = None
        self.member = None
        self.started = 0.0
        self.produced = 0

    @classmethod
    def build(cls, target, draft=None, heads=(), head=None, **options) -> "Auto":
        from ..heads.eagle import read_info
        from . import DRAFTERS

        from .lookahead import Lookahead

        members = {"lookahead": (Lookahead(), DRAFTERS["lookahead"].default_k)}
        for folder in [*heads, *([head] if head else [])]:
            kind = read_info(Path(folder)).kind
            if kind not in members and kind in DRAFTERS and target.uses_lean_forward:
                members[kind] = (DRAFTERS[kind].build(target, draft, head=folder), DRAFTERS[kind].default_k)
        return cls(members)

    @property
    def members(self) -> tuple[str, ...]:
        return ("none", "prompt-lookup", *self.heads)

    def reset(self) -> None:
        """A new generation: the measurements so far stay; the unfinished step is not counted."""
        for drafter, _ in self.heads.values():
            drafter.reset()
        self.chosen = self.member = None
        self.produced = 0

    def _close(self) -> None:
        """Book the step that just ended under the choice that drafted it."""
        now = time.perf_counter()
        if self.chosen is not None and self.produced:
            self.rates.setdefault(self.chosen, _Rate()).add(self.produced, now - self.started, self.steps)
        self.chosen, self.produced, self.started = None, 0, now

    def _pick(self, options: list[str]) -> str:
        rates = {o: self.rates.get(o) for o in options}
        untried = [o for o in options if rates[o] is None or rates[o].count < TRIES]
        if untried:
            return untried[0]
        if self.steps % EXPLORE_EVERY == 0:
            return min(options, key=lambda o: rates[o].last_used)
        return max(options, key=lambda o: rates[o].value)

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        self._close()
        self.steps += 1
        if k <= 0:
            return empty_draft()
        n, _ = longest_match(ctx.tokens.numpy(), self.lookup.max_n)
        options = ["none", *([_lookup_bucket(n)] if n else []), *self.heads]
        choice = self._pick(options)
        self.chosen = choice
        if choice == "none":
            self.member = None
            return empty_draft()
        if choice in self.heads:
            self.member, own_k = self.heads[choice]
        else:
            self.member, own_k = self.lookup, self.lookup_k
        return self.member.propose(ctx, min(k, own_k))

    @property
    def learns_from_tree(self) -> bool:
        return self.member is not None and self.member.learns_from_tree

    def observe_tree(self, best: dict[int, int]) -> None:
        self.member.observe_tree(best)

    def observe(self, accepted: int, next_token: int) -> None:
        self.produced = accepted + 1
        if self.member is not None:
            self.member.observe(accepted, next_token)

    def summary(self) -> dict[str, float]:
        """Measured tokens per second of each choice so far (for reports)."""
        return {name: round(rate.value, 2) for name, rate in sorted(self.rates.items())}

