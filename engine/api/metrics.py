"""Step counts and the speedup's text, without torch: one accumulator of a generation's counts
(`StepTotals`: the decoder's, the server's per request, a client's for a stream cut short), the window's
running figures (`LiveMetrics`), the live speedup summed over answers (`SpeedupSum`).

Definitions (the window, the terminal, the server's stream and /metrics, `generate --json` and the
bench all use these; docs/ENGINE.md spells them out):
- acceptance rate = accepted draft tokens / drafted tokens
- mean accepted length = new tokens / target forwards (1.0 for plain decoding; prefill included)
- per-position acceptance[i] = accepted at draft position i / drafted at position i
- tokens/s = new tokens / wall time (rolling: over the last `window` steps)
- speedup: measured inside each answer by `decoding.speedup.SpeedupMeter` and carried by its steps
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from .events import BaselineCost, ServerStats, Step, Totals, decode_rate


# a speedup whose standard error is over this share of it is no figure yet: too few plain steps were timed (or they
# scatter too widely) to tell, as in an answer stopped after a few steps (a cancelled one at 0% acceptance read
# "1.88× ±0.93", where drafting nothing cannot have gained)
UNSURE = 0.25


def speedup_text(speedup: float | None, error: float | None) -> str:
    """The speedup as shown everywhere: 1.84×; 1.84× ±0.21 while its standard error is over 5%; n/a while it is
    over UNSURE; ~1.84× from a single plain sample; – when unknown."""
    if speedup is None:
        return "–"
    if error is not None and error > UNSURE * speedup:
        return "n/a"
    if error is None or error > 0.05 * speedup:
        return f"{speedup:.2f}× ±{error:.2f}" if error is not None else f"~{speedup:.2f}×"
    return f"{speedup:.2f}×"


def speedup_part(speedup: float | None, error: float | None) -> str:
    """The speedup in an answer's summary line (the window's footer, the terminal's): "1.84× vs plain", or what
    stands for it while it is no figure; empty when unknown."""
    if speedup is None:
        return ""
    text = speedup_text(speedup, error)
    return "speedup n/a (too few plain steps timed)" if text == "n/a" else f"{text} vs plain"


class SpeedupSum:
    """The live speedup over several answers (docs/ENGINE.md): each answer's plain time (its speedup times
    its decode time) and its decode time, summed, so that answers weigh by their decode time."""

    def __init__(self) -> None:
        self.plain_s = self.spent_s = 0.0
        self._err2: float | None = None  # the summed variances of the plain times, where known

    def add(self, speedup: float | None, speedup_err: float | None, decode_s: float) -> None:
        if speedup is None or decode_s <= 0:
            return
        self.plain_s += speedup * decode_s
        self.spent_s += decode_s
        if speedup_err is not None:
            self._err2 = (self._err2 or 0.0) + (speedup_err * decode_s) ** 2

    @classmethod
    def of(cls, sums) -> SpeedupSum:
        """The sums of several SpeedupSums."""
        total = cls()
        for one in sums:
            total.plain_s += one.plain_s
            total.spent_s += one.spent_s
            if one._err2 is not None:
                total._err2 = (total._err2 or 0.0) + one._err2
        return total

    @property
    def value(self) -> float | None:
        return self.plain_s / self.spent_s if self.spent_s > 0 else None

    @property
    def error(self) -> float | None:
        return math.sqrt(self._err2) / self.spent_s if self._err2 is not None and self.spent_s > 0 else None


def merge_positions(drafted: list[int], accepted: list[int], more_drafted, more_accepted) -> None:
    """Add per-position counts into (drafted, accepted), growing them as needed."""
    for i, (d, a) in enumerate(zip(more_drafted, more_accepted)):
        if i >= len(drafted):
            drafted.append(0)
            accepted.append(0)
        drafted[i] += d
        accepted[i] += a


def summed(parts: Iterable[Totals]) -> Totals:
    """Several generations' Totals as one (a conversation's turns, a bench's prompt): counts and times added in
    order, the accepted lengths joined, the per-position counts merged."""
    parts = list(parts)
    drafted: list[int] = []
    accepted: list[int] = []
    for t in parts:
        merge_positions(drafted, accepted, t.position_drafted, t.position_accepted)

    def add(name: str):
        return sum(getattr(t, name) for t in parts)

    return Totals(new_tokens=add("new_tokens"), steps=add("steps"), target_forwards=add("target_forwards"),
                  drafted=add("drafted"), accepted=add("accepted"), wall_s=float(add("wall_s")),
                  prefill_s=float(add("prefill_s")), draft_s=float(add("draft_s")), verify_s=float(add("verify_s")),
                  accepted_lengths=tuple(n for t in parts for n in t.accepted_lengths),
                  position_drafted=tuple(drafted), position_accepted=tuple(accepted))


def count_step(drafted: list[int], accepted: list[int], n_drafted: int, n_accepted: int) -> None:
    """Add one step's per-position counts: positions 0..n_drafted-1 drafted, the first n_accepted kept."""
    positions = range(n_drafted)
    merge_positions(drafted, accepted, [1 for _ in positions], [int(i < n_accepted) for i in positions])


class StepTotals:
    """The one accumulator of step counts: steps, drafted and accepted tokens, per draft position, each
    drafting step's accepted length, and the time spent drafting and verifying. The decoder counts a
    generation's Totals with it, a client a stream cut short, the server its /metrics counters since it
    started, the window an answer's running figures."""

    def __init__(self) -> None:
        self.steps = self.drafted = self.accepted = 0
        self.draft_s = self.verify_s = self.prefill_s = 0.0
        self.accepted_lengths: list[int] = []
        self.pos_drafted: list[int] = []  # per draft position, grown as drafts get longer
        self.pos_accepted: list[int] = []

    def add_step(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        if drafted:
            self.accepted_lengths.append(accepted)
        count_step(self.pos_drafted, self.pos_accepted, drafted, accepted)

    def add(self, step: Step) -> None:
        """A step event: the prefill (step 0) gives its time, a decode step its counts and times."""
        if step.step == 0:
            self.set_prefill(step.elapsed_s)
        else:
            self.add_step(step.drafted, step.accepted, step.draft_s, step.verify_s)

    def set_prefill(self, elapsed_s: float) -> None:
        """The time to the first token (the prompt read, its first token made)."""
        self.prefill_s = elapsed_s

    def add_inferred(self, accepted: int | None) -> None:
        """A server's decode step seen only in its stream: its size tells how many drafts it kept (None where a
        chunk merged several steps); what it drafted comes from the server's counters (take_counters)."""
        self.steps += 1
        if accepted is not None:
            self.accepted_lengths.append(accepted)

    def take_counters(self, stats: ServerStats) -> None:
        """A server's counters over a request: they replace the drafted and accepted figures, which its stream
        does not carry; each of its drafting steps drafted every position."""
        self.drafted, self.accepted = stats.draft_tokens, stats.accepted
        self.pos_accepted = list(stats.position_accepted)
        self.pos_drafted = [stats.drafts for _ in stats.position_accepted]

    @property
    def drafts(self) -> int:
        """Steps that drafted something."""
        return len(self.accepted_lengths)

    def per_position(self) -> list[float]:
        """Acceptance at each draft position."""
        return [a / d if d else 0.0 for a, d in zip(self.pos_accepted, self.pos_drafted)]

    def totals(self, new_tokens: int, wall_s: float) -> Totals:
        return Totals(
            new_tokens=new_tokens,
            steps=self.steps,
            target_forwards=self.steps + 1,
            drafted=self.drafted,
            accepted=self.accepted,
            wall_s=wall_s,
            prefill_s=self.prefill_s,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            accepted_lengths=tuple(self.accepted_lengths),
            position_drafted=tuple(self.pos_drafted),
            position_accepted=tuple(self.pos_accepted),
        )


class LiveMetrics:
    """Running figures for one generation, fed one Step at a time (used by the GUI and the CLI)."""

    def __init__(self, baseline: BaselineCost | None = None, window: int = 16) -> None:
        self.baseline = baseline
        self.window = window
        self.reset()

    def reset(self) -> None:
        self.new_tokens = 0
        self.forwards = 0
        self.counts = StepTotals()
        self.decode_start_s: float | None = None  # elapsed time when the prefill ended
        self.decode_start_len = 0
        self.last_elapsed_s = 0.0
        self._recent: deque[tuple[float, int]] = deque(maxlen=self.window + 1)  # (elapsed, tokens)
        self.live: tuple[float | None, float | None, float | None] = (None, None, None)  # the engine's, below

    def add(self, step: Step) -> None:
        self.forwards += 1
        self.new_tokens += len(step.tokens)
        self.last_elapsed_s = step.elapsed_s
        if step.speedup is not None or step.plain_step_s is not None:
            self.live = (step.speedup, step.speedup_err, step.plain_step_s)
        self._recent.append((step.elapsed_s, self.new_tokens))
        if step.step == 0:
            self.decode_start_s = step.elapsed_s
            self.decode_start_len = step.context_len + len(step.tokens)
            return
        if step.inferred:  # a remote server's step: its length is known, its draft only from the counters
            one_step = step.accepted > 0 or len(step.tokens) == 1  # not a chunk that merged several steps
            self.counts.add_inferred(step.accepted if one_step else None)
            return
        self.counts.add(step)

    def add_server(self, stats) -> None:
        """A remote server's counters since the request started (events.ServerStats): they replace the
        drafted/accepted figures, which the stream itself does not carry."""
        self.counts.take_counters(stats)

    @property
    def drafted(self) -> int:
        return self.counts.drafted

    @property
    def accepted(self) -> int:
        return self.counts.accepted

    @property
    def accepted_lengths(self) -> list[int]:
        return self.counts.accepted_lengths

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def per_position(self) -> list[float]:
        return self.counts.per_position()

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second after the first token (the prompt's processing is not generation)."""
        if self.decode_start_s is None:
            return 0.0
        return decode_rate(self.new_tokens, self.last_elapsed_s - self.decode_start_s)

    @property
    def speedup_err(self) -> float | None:
        return self.live[1] if self.live[0] is not None else None

    def plain_rate(self, context_len: int) -> float | None:
        """Plain decoding's tokens/s now: measured in this answer (or recent ones), else from a baseline."""
        if self.live[2]:
            return 1.0 / self.live[2]
        cost = self.baseline.per_token(context_len) if self.baseline is not None else 0.0
        return 1.0 / cost if cost > 0 else None

    @property
    def rolling_tokens_per_s(self) -> float:
        if len(self._recent) < 2:
            return self.tokens_per_s
        (t0, n0), (t1, n1) = self._recent[0], self._recent[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def speedup(self) -> float | None:
        """The engine's live speedup (SpeedupMeter, carried by each step). A server that does not say
        (vLLM) is measured against its baseline server's speed instead, when one is set."""
        if self.live[0] is not None:
            return self.live[0]
        if self.baseline is None or self.decode_start_s is None:
            return None
        decoded = self.new_tokens - (self.new_tokens and 1)  # the prefill's token is not a decode step
        spent = self.last_elapsed_s - self.decode_start_s
        if decoded <= 0 or spent <= 0:
            return None
        return self.baseline.expected(self.decode_start_len, decoded) / spent
