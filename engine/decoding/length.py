"""How long each step's draft is: the measured-cost policy (`DraftLength`) and the older grow/shrink
rule (`next_k`, --adaptive-k)."""

from __future__ import annotations


def next_k(k: int, drafted: int, accepted: int, k_max: int) -> int:
    """Adaptive draft length: grow by 2 after a fully accepted draft, shrink by 1 after a rejection."""
    if drafted == 0:
        return k
    if accepted == drafted:
        return min(k_max, k + 2)
    return max(1, k - 1)


class DraftLength:
    """Each step's draft length from what was measured: the n (0..k) with the most expected tokens per
    expected second. Expected tokens of a draft of n: 1 + the sum over positions i < n of the share of
    recent drafts that reached position i and had it kept (FORGET; PRIOR rejections to start from).
    Expected seconds: the recent cost of steps that drafted n, in plain steps (each step's wall time over
    the plain-step cost measured when it ran; interpolated between measured lengths, 1 for n = 0), times
    the plain-step cost now. So a strategy whose guesses are seldom kept drafts less, or not at all (a plain
    step), and one on a roll drafts long; and what was learned still holds in the next answer, whose
    context (and so every step's time) may be longer or shorter. The first `warmup` drafting steps draft the
    full k; after that, every EXPLORE-th step drafts one token more than the best length, so that a longer
    draft that would pay is found, one token at a time."""

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
        self.cost: dict[int, float] = {}  # draft length -> recent step time, in plain steps
        self.drafting_steps = 0
        self.steps = 0
        self._best: dict[int, tuple[int, float]] = {}  # least -> (n, rate in tokens per plain step): until observed

    def observe(self, drafted: int, accepted: int, seconds: float, plain_s: float | None) -> None:
        """A step that drafted `drafted` tokens and kept `accepted`, its wall time, and the plain-step cost
        measured when it ran (None before any: its time is not booked)."""
        drafted = min(drafted, self.k)
        self._best.clear()
        if drafted:  # acceptance follows the conversation: a long session's earlier topics fade
            self.reached = [self.FORGET * r for r in self.reached]
            self.kept = [self.FORGET * c for c in self.kept]
        for i in range(drafted):
            self.reached[i] += 1
            self.kept[i] += i < accepted
        if plain_s:
            cost = seconds / plain_s
            old = self.cost.get(drafted)
            self.cost[drafted] = cost if old is None else self.DECAY * old + (1 - self.DECAY) * cost
        self.drafting_steps += drafted > 0

    def _time(self, n: int, plain_s: float | None) -> float | None:
        """Expected seconds of a step drafting n (in plain steps while no plain cost is known)."""
        known = dict(self.cost)
        known[0] = 1.0  # a plain step; measured drafting steps are in its units
        if n in known:
            cost = known[n]
        else:
            below = [m for m in known if m < n]
            above = [m for m in known if m > n]
            if below and above:
                lo, hi = max(below), min(above)
                cost = known[lo] + (known[hi] - known[lo]) * (n - lo) / (hi - lo)
            elif len(below) >= 2:  # extend the last measured slope
                lo, hi = sorted(below)[-2:]
                cost = known[hi] + (known[hi] - known[lo]) / (hi - lo) * (n - hi)
            else:
                return None
        return cost * plain_s if plain_s else cost

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
        """(n, expected tokens per second) of the best length n >= least; (k, 0.0) while nothing is known.
        Steps are timed in plain steps, so the best length does not depend on the plain-step cost now, which
        only scales the rate: it is worked out again only after a new measurement (auto asks each of its
        choices every step)."""
        if least not in self._best:
            self._best[least] = self._best_in_plain_steps(least)
        best, rate = self._best[least]
        return best, (rate / plain_s if plain_s else rate)

    def kept_share(self, i: int) -> float:
        """The share of recent drafts that reached position i and had it kept (PRIOR rejections to start from)."""
        return self.kept[i] / (self.reached[i] + self.PRIOR)

    def _best_in_plain_steps(self, least: int) -> tuple[int, float]:
        best, best_rate, tokens = self.k, 0.0, 1.0
        for n in range(self.k + 1):
            if n:
                if self.reached[n - 1] < 2:
                    break  # never measured that far: the drafter's own length decides
                tokens += self.kept_share(n - 1)
            t = self._time(n, None)
            if n < least or t is None or t <= 0:
                continue
            if tokens / t > best_rate:
                best, best_rate = n, tokens / t
        return best, best_rate
