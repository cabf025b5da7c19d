"""What a Compare measured, and the one figure it stands for (pure data: compare.py runs it, comparecard.py shows it).

A pair of runs, plain decoding then the strategy, one after the other, measures the machine as well as the strategy:
another program busy during one run and not the other moves their ratio (0.74-1.98x for a strategy at 1.45x on a
quiet machine). Each run reports what a plain step cost while it ran (its own plain samples), so a pair gives its
figure at one speed: the ratio of the rates where the two runs' plain steps agree (`Pair.steady`), else the ratio
with the second run brought to the first one's speed (`Pair.at_one_speed`).

The headline is one figure. Where the first pair ran at two machine speeds, or its figure and the strategy run's
own live figure (what the footer and the dock show) are more than AGREE apart (on the real 1.5B a steady pair read
0.59x where the live figure read 0.93x +-0.14 and the next Compares 1.26-1.31x), a second pair runs in the other order (none, strategy, strategy, none: a machine slowing or
speeding up steadily moves the two pairs' figures opposite ways), and the headline is the two figures' geometric
mean; where those two differ by more than UNSTEADY, the machine was too unsteady to say and the card says so
instead of a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PLAIN = "none"
DRIFT = 0.10  # the two runs' plain steps differing by more than this: the machine's speed changed between them ...
SURE = 3.0  # ... where the difference is also this many standard errors (not the samples' own scatter)
AGREE = 0.15  # a pair's figure this far from the live figure: a second pair runs
UNSTEADY = 0.25  # two pairs' figures this far apart: no figure


@dataclass(frozen=True)
class RunResult:
    """One run of a comparison."""

    strategy: str
    token_ids: tuple[int, ...]
    new_tokens: int
    tokens_per_s: float
    acceptance: float | None
    reason: str
    live: float | None = None  # the live speedup measured inside this run (what the dock and footer show)
    live_err: float | None = None
    plain_step_s: float | None = None  # what a plain step cost while this run went on (its own samples)
    plain_step_err: float | None = None  # ... its standard error
    text: str = ""

    @classmethod
    def of(cls, strategy: str, finished) -> RunResult:
        t = finished.totals
        return cls(strategy, tuple(finished.token_ids), t.new_tokens, t.tokens_per_s, t.acceptance_rate,
                   finished.reason, finished.speedup, finished.speedup_err, finished.plain_step_s,
                   finished.plain_step_err, finished.text)


@dataclass(frozen=True)
class Pair:
    """A plain run and a strategy run, one after the other (in either order)."""

    plain: RunResult
    fast: RunResult

    @property
    def speedup(self) -> float | None:
        """Measured: the strategy's decode rate over the plain one."""
        if self.plain.tokens_per_s <= 0 or self.fast.tokens_per_s <= 0:
            return None
        return self.fast.tokens_per_s / self.plain.tokens_per_s

    @property
    def slowdown(self) -> float | None:
        """How much slower a plain step ran during the strategy's run than during the plain one (1: the same speed);
        None where a run took no plain samples (a short answer, a server)."""
        if not self.plain.plain_step_s or not self.fast.plain_step_s:
            return None
        return self.fast.plain_step_s / self.plain.plain_step_s

    @property
    def steady(self) -> bool:
        """Whether both runs ran at one machine speed, as far as it is known: their plain steps within DRIFT of each
        other, or apart by less than SURE standard errors (a fast model's steps of a few milliseconds scatter)."""
        if self.slowdown is None or abs(self.slowdown - 1) <= DRIFT:
            return True
        errors = (self.plain.plain_step_err, self.fast.plain_step_err)
        if None in errors:  # a run with a single sample: its scatter is unknown
            return True
        apart = abs(self.fast.plain_step_s - self.plain.plain_step_s)
        return apart <= SURE * math.hypot(*errors)

    @property
    def at_one_speed(self) -> float | None:
        """The measured speedup with the strategy's run brought to the plain run's machine speed."""
        return None if self.speedup is None or self.slowdown is None else self.speedup * self.slowdown

    @property
    def figure(self) -> float | None:
        """What this pair says: the measured ratio at one machine speed."""
        return self.speedup if self.steady else self.at_one_speed


@dataclass(frozen=True)
class Comparison:
    strategy: str  # the speculative side
    seed: int
    temperature: float
    plain: RunResult | None = None  # run 1
    fast: RunResult | None = None  # run 2
    running: str | None = None  # the strategy generating now
    error: str = ""  # why it ended early ("stopped" or the engine's message)
    dropped: int = 0  # oldest messages left out to fit the context window
    fast_again: RunResult | None = None  # run 3, where a second pair runs (`wants_second_pair`)
    plain_again: RunResult | None = None  # run 4
    second_pair_why: str = ""  # why the second pair ran, in words

    @property
    def done(self) -> bool:
        return self.plain is not None and self.fast is not None

    @property
    def first_pair(self) -> Pair | None:
        return Pair(self.plain, self.fast) if self.done else None

    @property
    def second_pair(self) -> Pair | None:
        if self.fast_again is None or self.plain_again is None:
            return None
        return Pair(self.plain_again, self.fast_again)

    @property
    def runs(self) -> tuple[RunResult, ...]:
        return tuple(r for r in (self.plain, self.fast, self.fast_again, self.plain_again) if r is not None)

    # the first pair's figures (what one pair measures)
    @property
    def speedup(self) -> float | None:
        return self.first_pair.speedup if self.done else None

    @property
    def slowdown(self) -> float | None:
        return self.first_pair.slowdown if self.done else None

    @property
    def steady(self) -> bool:
        return self.first_pair.steady if self.done else True

    @property
    def at_one_speed(self) -> float | None:
        return self.first_pair.at_one_speed if self.done else None

    def wants_second_pair(self) -> str:
        """Why a second pair should run (empty: the first pair's figure stands): it ran at two machine speeds, or
        its figure and the strategy run's live figure disagree."""
        if not self.done or self.second_pair is not None or self.first_pair.figure is None:
            return ""
        if not self.steady:
            return "the machine's speed changed between the first two runs"
        live, figure = self.fast.live, self.first_pair.figure
        if live is None or live <= 0 or figure <= 0:
            return ""
        if max(figure, live) > (1 + AGREE) * min(figure, live):
            return f"the first pair's {figure:.2f}× and the live figure's {live:.2f}× disagreed"
        return ""

    @property
    def figures(self) -> tuple[float, ...]:
        """Each finished pair's figure."""
        pairs = (self.first_pair, self.second_pair)
        return tuple(p.figure for p in pairs if p is not None and p.figure is not None)

    @property
    def unsteady(self) -> bool:
        """Two pairs whose figures differ by more than UNSTEADY: the machine's speed changed too much to say."""
        figures = self.figures
        return len(figures) == 2 and max(figures) > (1 + UNSTEADY) * min(figures)

    @property
    def headline(self) -> float | None:
        """The one figure the card stands by: the first pair's, or both pairs' geometric mean; None where the
        machine was too unsteady (or the runs too short) to say."""
        figures = self.figures
        if not figures or self.unsteady:
            return None
        return math.exp(sum(math.log(f) for f in figures) / len(figures))

    @property
    def identical(self) -> bool | None:
        return all(r.token_ids == self.plain.token_ids for r in self.runs) if self.done else None

    @property
    def first_difference(self) -> int | None:
        """The index of the first token where the outputs part (None when identical or not done)."""
        if not self.done or self.identical:
            return None
        other = next(r for r in self.runs if r.token_ids != self.plain.token_ids)
        pairs = zip(self.plain.token_ids, other.token_ids)
        return next((i for i, (a, b) in enumerate(pairs) if a != b),
                    min(len(self.plain.token_ids), len(other.token_ids)))
