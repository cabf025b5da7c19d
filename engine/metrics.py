"""Acceptance, accepted length, per-position acceptance, tokens/s and speedup.

Definitions (the window, the terminal, the server's stream and /metrics, `generate --json` and the
bench all use these; docs/ENGINE.md spells them out):
- acceptance rate = accepted draft tokens / drafted tokens
- mean accepted length = new tokens / target forwards (1.0 for plain decoding; prefill included)
- per-position acceptance[i] = accepted at draft position i / drafted at position i
- tokens/s = new tokens / wall time (rolling: over the last `window` steps)
- speedup (live, `SpeedupMeter`) = P / T over the answer's decode steps (the prefill excluded): T is the
  wall time they took, P what plain decoding would have taken for the same tokens, measured in the
  same answer: every step that drafted nothing is a plain decoding step, and its time (its drafting
  excluded) is a sample of the plain step's cost now. The decoder makes such a step now and then when
  the strategy makes none of its own (`probe_due`). A speculative step's tokens are costed at the mean
  of the plain samples on either side of it in time, so a machine that slows down (another program)
  slows both sides of the ratio alike. Its uncertainty is the standard error of those samples.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

from .events import BaselineCost, Step, Totals, decode_rate


def measure_baseline(runner, lengths=(32, 512), repeats: int = 5) -> BaselineCost:
    """Time single-token forwards at a few context lengths and fit c(L) = a + b*L. Leaves the cache empty."""
    import torch  # here, so the GUI's live metrics (LiveMetrics) never load torch

    lengths = sorted({min(max(1, L), runner.max_len - 1) for L in lengths})
    runner.truncate(0)
    filler = torch.randint(0, runner.vocab_size, (lengths[-1] + 1,))
    runner.forward(filler[: lengths[-1]])
    probe = filler[-1:]
    points = []
    for length in lengths:
        times = []
        for _ in range(repeats + 1):
            runner.truncate(length)
            t0 = time.perf_counter()
            runner.forward(probe).argmax().item()  # .item() waits for the device
            times.append(time.perf_counter() - t0)
        points.append((length, statistics.median(times[1:])))
    runner.truncate(0)
    if len(points) == 1:
        return BaselineCost(points[0][1], 0.0)
    (l0, t0), (l1, t1) = points[0], points[-1]
    b = max(0.0, (t1 - t0) / (l1 - l0))
    return BaselineCost(max(1e-6, t0 - b * l0), b)


MIN_PLAIN = 3  # plain samples an answer needs before its speedup is more than a guess
PROBE_EVERY = 24  # then, at most this many decode steps between plain steps
NOISY_GAP = 8  # ... or this many while the plain samples scatter (the machine is busy with other work)
NOISY = 0.05  # relative standard error above which the samples scatter
EARLY_GAP = 2  # until it has MIN_PLAIN: a plain step after this many speculative ones
RECENT_S = 30.0  # plain samples from earlier answers younger than this count for a new answer


def probe_due(samples: int, since_plain: int, relative_error: float | None = None) -> bool:
    """Whether the next decode step should be a plain one (no draft) to measure plain decoding's cost:
    a few early in an answer that has no recent samples, then one every PROBE_EVERY steps that a
    strategy spends drafting, or every NOISY_GAP while the samples scatter. A plain step is lossless
    (it is what `none` does); it costs the answer the tokens a draft would have added, a few percent."""
    if samples < MIN_PLAIN:
        return since_plain >= EARLY_GAP
    noisy = relative_error is not None and relative_error > NOISY
    return since_plain >= (NOISY_GAP if noisy else PROBE_EVERY)


class SpeedupMeter:
    """The live speedup of one answer (see the module's definition): fed each decode step's tokens,
    wall time and, for a plain step, its plain time. `seeds` are recent plain samples of earlier answers
    on the same model: they stand at the start of this one until its own arrive."""

    def __init__(self, seeds=()) -> None:
        self.seeds = [float(x) for x in seeds]
        self.samples: list[float] = []  # this answer's plain step times, in order
        self.plain_s = 0.0  # what plain decoding would have taken for the tokens of closed stretches
        self.spent_s = 0.0  # what the decode steps took
        self.tokens = 0
        self.since_plain = 0  # decode steps since the last plain one
        self._open = 0  # tokens of speculative steps since the last plain sample

    @property
    def _last(self) -> float | None:
        pool = self.samples or self.seeds
        return pool[-1] if pool else None

    def add(self, tokens: int, seconds: float, plain_s: float | None = None, sample: bool = True) -> None:
        """A decode step: its tokens and wall time; for a plain step, its plain time, a sample of plain
        decoding's cost unless `sample` is False (it counts only for itself: the first step, cold)."""
        self.tokens += tokens
        self.spent_s += seconds
        if plain_s is not None and not sample:
            self.plain_s += tokens * plain_s
            return
        if plain_s is None:
            self._open += tokens
            self.since_plain += 1
            return
        last = self._last
        self.plain_s += self._open * (plain_s if last is None else (last + plain_s) / 2)
        self.plain_s += tokens * plain_s
        self._open = self.since_plain = 0
        self.samples.append(plain_s)

    @property
    def pool(self) -> list[float]:
        """The samples the current estimate rests on: this answer's, else the seeds."""
        return self.samples if len(self.samples) >= MIN_PLAIN or not self.seeds else self.seeds + self.samples

    @property
    def plain_step_s(self) -> float | None:
        """The cost of a plain decoding step now (the latest samples' mean)."""
        pool = self.pool[-MIN_PLAIN:]
        return statistics.fmean(pool) if pool else None

    @property
    def value(self) -> float | None:
        last = self._last
        if last is None or self.spent_s <= 0 or self.tokens <= 0:
            return None
        return (self.plain_s + self._open * last) / self.spent_s

    @property
    def relative_error(self) -> float | None:
        """The standard error of the plain samples' mean over the mean: `value`'s relative error (the
        time spent is measured, not estimated). None with fewer than two samples."""
        pool = self.pool
        if len(pool) < 2:
            return None
        mean = statistics.fmean(pool)
        return statistics.stdev(pool) / (mean * math.sqrt(len(pool))) if mean > 0 else None

    @property
    def error(self) -> float | None:
        """One standard error of `value`; None with fewer than two plain samples."""
        value, relative = self.value, self.relative_error
        return value * relative if value is not None and relative is not None else None


def speedup_text(speedup: float | None, error: float | None) -> str:
    """The speedup as shown everywhere: 1.84×; 1.84× ±0.21 while its standard error is over 5%; ~1.84× from
    a single plain sample; – when unknown."""
    if speedup is None:
        return "–"
    if error is None or error > 0.05 * speedup:
        return f"{speedup:.2f}× ±{error:.2f}" if error is not None else f"~{speedup:.2f}×"
    return f"{speedup:.2f}×"


class DraftLength:
    """Each step's draft length from what was measured: the n (0..k) with the most expected tokens per
    expected second. Expected tokens of a draft of n: 1 + the sum over positions i < n of the share of
    recent drafts that reached position i and had it kept (FORGET; PRIOR rejections to start from).
    Expected seconds: the mean time of recent steps that drafted n (interpolated between measured lengths,
    plain steps for n = 0). So a strategy whose
    guesses are seldom kept drafts less, or not at all (a plain step), and one on a roll drafts long.
    The first `warmup` drafting steps draft the full k; after that, every EXPLORE-th step drafts one token
    more than the best length, so that a longer draft that would pay is found, one token at a time."""

    EXPLORE = 8
    WARMUP = 6  # drafting steps before the choice is trusted
    DECAY = 0.8  # weight of a length's earlier time per new measurement
    PRIOR = 2  # each position counts as rejected this many times before it is seen: few drafts promise little
    FORGET = 0.98  # weight of the earlier drafts' acceptance per new draft: the recent ~50 drafts count

    def __init__(self, k: int, warmup: int = WARMUP) -> None:
        self.k = k
        self.warmup = warmup
        self.reached = [0.0] * (k + 1)  # drafts that reached position i
        self.kept = [0.0] * (k + 1)  # ... and had position i kept
        self.seconds: dict[int, float] = {}  # draft length -> recent step time
        self.drafting_steps = 0
        self.steps = 0

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        drafted = min(drafted, self.k)
        if drafted:  # acceptance follows the conversation: a long session's earlier topics fade
            self.reached = [self.FORGET * r for r in self.reached]
            self.kept = [self.FORGET * c for c in self.kept]
        for i in range(drafted):
            self.reached[i] += 1
            self.kept[i] += i < accepted
        old = self.seconds.get(drafted)
        self.seconds[drafted] = seconds if old is None else self.DECAY * old + (1 - self.DECAY) * seconds
        self.drafting_steps += drafted > 0

    def _time(self, n: int, plain_s: float | None) -> float | None:
        known = dict(self.seconds)
        if plain_s:
            known[0] = plain_s
        if n in known:
            return known[n]
        below = [m for m in known if m < n]
        above = [m for m in known if m > n]
        if below and above:
            lo, hi = max(below), min(above)
            return known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
        if below and len(below) >= 2:  # extend the last measured slope
            lo, hi = sorted(below)[-2:]
            return known[hi] + (known[hi] - known[lo]) / (hi - lo) * (n - hi)
        return None

    def choose(self, plain_s: float | None) -> int:
        self.steps += 1
        if not self.warm:
            return self.k
        best = self.best(plain_s)[0]
        # now and then one token more than pays now, to see whether it would: every EXPLORE-th step, or
        # every 4 * EXPLORE-th while plain steps win (a drafter that does not pay costs little)
        if self.steps % (self.EXPLORE if best else 4 * self.EXPLORE) == 0:
            return min(self.k, best + 1)
        return best

    @property
    def warm(self) -> bool:
        return self.drafting_steps >= self.warmup

    def best(self, plain_s: float | None, least: int = 0) -> tuple[int, float]:
        """(n, expected tokens per second) of the best length n >= least; (k, 0.0) while nothing is known."""
        best, best_rate, tokens = self.k, 0.0, 1.0
        for n in range(self.k + 1):
            if n:
                if self.reached[n - 1] < 2:
                    break  # never measured that far: the drafter's own length decides
                tokens += self.kept[n - 1] / (self.reached[n - 1] + self.PRIOR)
            t = self._time(n, plain_s)
            if n < least or t is None or t <= 0:
                continue
            if tokens / t > best_rate:
                best, best_rate = n, tokens / t
        return best, best_rate


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

    @property
    def value(self) -> float | None:
        return self.plain_s / self.spent_s if self.spent_s > 0 else None

    @property
    def error(self) -> float | None:
        return math.sqrt(self._err2) / self.spent_s if self._err2 is not None and self.spent_s > 0 else None


class PlainHistory:
    """A model's recent plain-step samples across answers (a Session keeps one): a new answer starts
    from those younger than RECENT_S instead of probing at once."""

    def __init__(self) -> None:
        self._items: deque[tuple[float, float]] = deque(maxlen=4 * MIN_PLAIN)

    def add(self, seconds: float) -> None:
        self._items.append((time.monotonic(), seconds))

    def seeds(self) -> list[float]:
        now = time.monotonic()
        return [s for t, s in self._items if now - t <= RECENT_S][-MIN_PLAIN:]


def merge_positions(drafted: list[int], accepted: list[int], more_drafted, more_accepted) -> None:
    """Add per-position counts into (drafted, accepted), growing them as needed."""
    for i, (d, a) in enumerate(zip(more_drafted, more_accepted)):
        if i >= len(drafted):
            drafted.append(0)
            accepted.append(0)
        drafted[i] += d
        accepted[i] += a


def count_step(drafted: list[int], accepted: list[int], n_drafted: int, n_accepted: int) -> None:
    """Add one step's per-position counts: positions 0..n_drafted-1 drafted, the first n_accepted kept."""
    positions = range(n_drafted)
    merge_positions(drafted, accepted, [1 for _ in positions], [int(i < n_accepted) for i in positions])


class StepTotals:
    """Counters for the Totals of one generation, step by step: the decoder's, and a client's for a stream
    that was cut short (engine/client.py)."""

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
        self.drafted = 0
        self.accepted = 0
        self.position_drafted: list[int] = []
        self.position_accepted: list[int] = []
        self.accepted_lengths: list[int] = []
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
            if step.accepted > 0 or len(step.tokens) == 1:  # not a chunk that merged several steps
                self.accepted_lengths.append(step.accepted)
            return
        self.drafted += step.drafted
        self.accepted += step.accepted
        if step.drafted:
            self.accepted_lengths.append(step.accepted)
        count_step(self.position_drafted, self.position_accepted, step.drafted, step.accepted)

    def add_server(self, stats) -> None:
        """A remote server's counters since the request started (events.ServerStats): they replace the
        drafted/accepted figures, which the stream itself does not carry."""
        self.drafted, self.accepted = stats.draft_tokens, stats.accepted
        self.position_accepted = list(stats.position_accepted)
        self.position_drafted = [stats.drafts for _ in stats.position_accepted]

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float:
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

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
