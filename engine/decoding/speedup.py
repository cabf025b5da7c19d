"""The live speedup, measured inside each answer, and the plain-decoding baseline.

speedup = P / T over the answer's decode steps (the prefill excluded): T is the wall time they took, P
what plain decoding would have taken for the same tokens, measured in the same answer: a step that drafted
nothing, following SETTLE such steps, is plain decoding as `none` runs it, and its time (its drafting
excluded) is a sample of the plain step's cost now. The decoder makes such steps now and then when the
strategy makes none of its own (`SpeedupMeter.probe_due`: a short run of plain steps). A speculative step's tokens are
costed at the mean of the plain samples on either side of it in time, so a machine that slows down
(another program) slows both sides of the ratio alike. Its uncertainty is the standard error of those
samples.

A machine whose speed changes between two runs of samples (another program starts or stops) would have the
stretch between them costed at the mean of the old speed and the new. The verify passes tell it sooner: each
pass's time is set against the first pass of as many rows after the latest samples, and SHIFT_STEPS passes in a
row beyond SHIFT of theirs call a run of plain steps at once; the tokens before the first of those passes are
costed at the old samples alone, the rest at the new. (A pass of a given row count costs the same to within
10-20% on a quiet machine, whatever ran before it; another program on one of two cores makes it 1.5-2x.)

Why a run and not one plain step: a plain step right after a verify pass, or after any pause between
steps, costs more than one in the middle of plain decoding (here 10-17% after a pass of 4-8 rows, fading
over about six plain steps; 20-85% after a pause of 5-20 ms), and `none`, which the figure stands for,
never pays that. Timed alone, such a step made the figure read about a tenth high. The steps that settle
a run are costed like speculative ones, at the samples' mean: their own time is in T like every step's.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

from ..api.events import BaselineCost


def measure_baseline(runner, lengths=(32, 512), repeats: int = 5) -> BaselineCost:
    """Time single-token forwards at a few context lengths and fit c(L) = a + b*L. Leaves the cache empty."""
    import torch

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
SETTLE = 4  # plain steps in a row before the next one is a sample of plain decoding's cost
RUN_SAMPLES = 2  # samples a run of plain steps gives before drafting resumes
EARLY_GAP = 2  # an answer without recent samples: speculative steps before its first run
PROBE_EVERY = 64  # then, at most this many decode steps between runs
NOISY_GAP = 24  # ... or this many while the samples scatter (the machine is busy with other work)
NOISY = 0.05  # relative standard error above which the samples scatter
RECENT_S = 30.0  # plain samples from earlier answers younger than this count for a new answer
SHIFT = 0.25  # a verify pass this much slower or faster than its rows' passes after the latest samples ...
SHIFT_STEPS = 3  # ... this many passes in a row: the machine's speed changed (plain steps measure it again)


class SpeedupMeter:
    """The live speedup of one answer (see the module's definition): fed each decode step's tokens,
    wall time and, for a plain step, its plain time. `seeds` are recent plain samples of earlier answers
    on the same model: they stand at the start of this one until its own arrive. `stale` are older ones:
    an answer with neither its own samples nor recent ones (a short answer a while after the last) is
    costed from them, as an estimate without an error (shown "~1.4×"), rather than not at all."""

    def __init__(self, seeds=(), stale=()) -> None:
        self.seeds = [float(x) for x in seeds]
        self.stale = [float(x) for x in stale]
        self.samples: list[float] = []  # this answer's plain step times, in order
        # their running mean and sum of squared deviations (Welford): the error is read every step, and
        # `statistics.stdev` over a long answer's samples took a millisecond of each step
        self._mean = self._m2 = 0.0
        self.plain_s = 0.0  # what plain decoding would have taken for the tokens of closed stretches
        self.spent_s = 0.0  # what the decode steps took
        self.tokens = 0
        self.since_plain = 0  # decode steps since the last sample
        self.plain_run = 0  # plain steps in a row up to the latest step
        self.run_samples = 0  # ... and the samples they gave
        self._open = 0  # tokens of steps since the last sample, to be costed at the samples' mean
        self.speculative = 0  # decode steps that drafted
        self._passes: dict[int, float] = {}  # rows -> the time of the first pass of as many rows since the samples
        self._shifted = 0  # passes in a row beyond SHIFT of their reference
        self._before_shift = 0  # of the open tokens, those before the first of them (at the old speed)

    @property
    def _last(self) -> float | None:
        pool = self.samples or self.seeds
        return pool[-1] if pool else None

    def add(self, tokens: int, seconds: float, plain_s: float | None = None, sample: bool = True,
            clean: bool = True, rows: int = 0, pass_s: float | None = None) -> bool:
        """A decode step: its tokens and wall time; for a plain step, its plain time. A plain step after
        SETTLE plain steps is a sample of plain decoding's cost (returns True); one after fewer is costed
        like a speculative step; one with `sample` False (the first step, cold) counts for itself only;
        one that is not `clean` (a drafter looked for a draft before it and found none) is costed like a
        speculative step and settles nothing. `rows`, `pass_s`: a speculative step's verify pass, its rows and
        time (a change of the machine's speed)."""
        if plain_s is None and pass_s is not None and rows > 1:
            self._watch(rows, pass_s)
        self.tokens += tokens
        self.spent_s += seconds
        settled = self.plain_run >= SETTLE
        self.plain_run = 0 if plain_s is None or not clean else self.plain_run + 1
        self.run_samples *= self.plain_run > 0
        if plain_s is not None and not sample:
            self.plain_s += tokens * plain_s
            return False
        if plain_s is None or not settled or not clean:
            self._open += tokens
            self.since_plain += 1
            self.speculative += plain_s is None
            return False
        last = self._last  # older answers' samples (stale) never blend into a measured stretch
        if last is not None and self.shifted:  # the speed changed within the stretch: before it, the old speed
            self.plain_s += self._before_shift * last + (self._open - self._before_shift) * plain_s
        else:
            self.plain_s += self._open * (plain_s if last is None else (last + plain_s) / 2)
        self.plain_s += tokens * plain_s
        self._open = self.since_plain = 0
        self._passes, self._shifted, self._before_shift = {}, 0, 0
        self.run_samples += 1
        self.samples.append(plain_s)
        delta = plain_s - self._mean
        self._mean += delta / len(self.samples)
        self._m2 += delta * (plain_s - self._mean)
        return True

    def _watch(self, rows: int, seconds: float) -> None:
        """A verify pass of `rows` rows took `seconds`: against the first such pass since the latest samples, is it
        SHIFT away (one more in a row) or not (the count starts again)?"""
        reference = self._passes.setdefault(rows, seconds)
        if abs(seconds / reference - 1) <= SHIFT:
            self._shifted = 0
            return
        if self._shifted == 0:
            self._before_shift = self._open  # this step's tokens are added after: they are the new speed's
        self._shifted += 1

    @property
    def shifted(self) -> bool:
        """Whether the last SHIFT_STEPS verify passes ran SHIFT slower or faster than theirs after the samples."""
        return self._shifted >= SHIFT_STEPS

    def probe_due(self, own_only: bool = False) -> bool:
        """Whether the next decode step should be a plain one (no draft) to measure plain decoding's cost:
        in an answer without recent samples, a run after its first EARLY_GAP steps until it has MIN_PLAIN
        (the step after the prompt drafts, as in every answer), then a run every
        PROBE_EVERY steps, or every NOISY_GAP while the samples scatter; a run goes on until it gives
        RUN_SAMPLES samples (SETTLE plain steps first). `own_only`: count this answer's samples only and keep
        the gap fixed (a seeded answer takes the same steps every time). A plain step is lossless (it is
        what `none` does); it costs the answer the tokens a draft would have added: one step in eleven, a
        few percent of the speedup."""
        if len(self.samples if own_only else self.pool) < MIN_PLAIN:  # a run that goes on until there are enough
            return self.plain_run > 0 or self.since_plain >= EARLY_GAP
        if 0 < self.run_samples < RUN_SAMPLES:
            return True
        if self.shifted and not own_only:  # the machine's speed changed: measure it again now
            return True
        error = None if own_only else self.relative_error
        return self.since_plain >= (NOISY_GAP if error is not None and error > NOISY else PROBE_EVERY)

    @property
    def pool(self) -> list[float]:
        """The samples the current estimate rests on: this answer's, else the seeds."""
        return self.samples if len(self.samples) >= MIN_PLAIN or not self.seeds else self.seeds + self.samples

    @property
    def plain_step_s(self) -> float | None:
        """The cost of a plain decoding step now (the latest samples' mean)."""
        pool = self.pool[-MIN_PLAIN:] or self.stale
        return statistics.fmean(pool) if pool else None

    @property
    def own_plain_s(self) -> float | None:
        """The mean of this answer's own plain samples (none of the seeds): the machine's plain step while it ran."""
        return self._mean if self.samples else None

    @property
    def own_plain_err(self) -> float | None:
        """The standard error of `own_plain_s`; None with fewer than two samples."""
        n = len(self.samples)
        return _standard_error(self._m2, n) if n >= 2 else None

    @property
    def value(self) -> float | None:
        """P / T; exactly 1 for an answer whose every step was a plain one (strategy none, or auto choosing
        plain decoding throughout): it is plain decoding, whatever its steps' times scatter."""
        if self.speculative == 0 and self.tokens > 0:
            return 1.0
        last = self._last or (self.stale[-1] if self.stale else None)
        if last is None or self.spent_s <= 0 or self.tokens <= 0:
            return None
        return (self.plain_s + self._open * last) / self.spent_s

    @property
    def relative_error(self) -> float | None:
        """The standard error of the plain samples' mean over the mean: `value`'s relative error (the
        time spent is measured, not estimated). None with fewer than two samples."""
        pool = self.pool
        n = len(pool)
        if n < 2:
            return None
        if pool is self.samples:
            mean, m2 = self._mean, self._m2
        else:  # a few seeds with the answer's first samples
            mean = statistics.fmean(pool)
            m2 = math.fsum((x - mean) ** 2 for x in pool)
        return _standard_error(m2, n) / mean if mean > 0 else None

    @property
    def error(self) -> float | None:
        """One standard error of `value`; None with fewer than two plain samples."""
        value, relative = self.value, self.relative_error
        if self.speculative == 0 and value is not None:
            return 0.0  # exact, not measured
        if not self.pool:
            return None  # from older answers' samples: an estimate
        return value * relative if value is not None and relative is not None else None


def _standard_error(m2: float, n: int) -> float:
    """The standard error of the mean of n samples whose squared deviations from it sum to m2."""
    return math.sqrt(max(m2, 0.0) / (n - 1) / n)


class PlainHistory:
    """A model's recent plain-step samples across answers (a Session keeps one): a new answer starts
    from those younger than RECENT_S instead of probing at once. Each is kept with the kind of step it
    timed ("compiled", "eager"...): an answer takes only its own kind's (the first answers after a start may
    run on the eager step while the compiled one is built)."""

    def __init__(self) -> None:
        self._items: deque[tuple[float, float, str]] = deque(maxlen=4 * MIN_PLAIN)

    def add(self, seconds: float, kind: str = "") -> None:
        self._items.append((time.monotonic(), seconds, kind))

    def seeds(self, kind: str = "") -> list[float]:
        now = time.monotonic()
        return [s for t, s, k in self._items if now - t <= RECENT_S and k == kind][-MIN_PLAIN:]

    def latest(self, kind: str = "") -> list[float]:
        """The latest samples, however old (a new answer's last resort: SpeedupMeter's `stale`)."""
        return [s for _, s, k in self._items if k == kind][-MIN_PLAIN:]
