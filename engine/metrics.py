"""Acceptance, accepted length, per-position acceptance, tokens/s and speedup.

Definitions (the GUI, CLI and bench all use these):
- acceptance rate = accepted draft tokens / drafted tokens
- mean accepted length = new tokens / target forwards (1.0 for plain decoding; prefill included)
- per-position acceptance[i] = accepted at draft position i / drafted at position i
- tokens/s = new tokens / wall time (rolling: over the last `window` steps)
- speedup = B / T, where T is the wall time spent decoding (after the prefill) and B is what plain
  decoding would have needed for the same tokens on the same model: B = sum over the new tokens of
  c(L), the measured cost of one plain decoding step at context length L. c(L) = a + b*L is fitted to
  single-token forwards timed at a few context lengths (`measure_baseline`).
"""

from __future__ import annotations

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

    def add(self, step: Step) -> None:
        self.forwards += 1
        self.new_tokens += len(step.tokens)
        self.last_elapsed_s = step.elapsed_s
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
    def rolling_tokens_per_s(self) -> float:
        if len(self._recent) < 2:
            return self.tokens_per_s
        (t0, n0), (t1, n1) = self._recent[0], self._recent[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    @property
    def speedup(self) -> float | None:
        if self.baseline is None or self.decode_start_s is None:
            return None
        decoded = self.new_tokens - (self.new_tokens and 1)  # the prefill's token is not a decode step
        spent = self.last_elapsed_s - self.decode_start_s
        if decoded <= 0 or spent <= 0:
            return None
        return self.baseline.expected(self.decode_start_len, decoded) / spent
