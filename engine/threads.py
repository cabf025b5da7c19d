"""Fewer compute threads while other programs keep the CPU's cores busy.

torch's matrix kernels split each product over all their threads and wait for the slowest. When other
programs keep some cores busy, a thread that shares a core is descheduled for whole time slices and every
product waits for it: on two cores with one busy program, decoding with two threads ran at 29-53 tokens/s
and with one at 79-85 (docs/PERFORMANCE.md). So between decode steps the governor looks at how many
threads the machine is running (Linux's /proc/stat `procs_running`, which counts ours too: torch's
workers spin between products) and uses the cores the others leave free, at least one and at most the
threads it started with. A decision takes the median of the last WINDOW samples, INTERVAL seconds apart,
so a burst shorter than about half a second changes nothing.

Losslessness: where the thread count changes a product's bits, an answer decoded while the count
changed would not be the target's own greedy answer. Before a model first runs with another count,
`same_bits` checks a single step and a verify pass bit for bit against the full count on the runner's
own cache (then rolls it back); where they differ, that count is never used for that model.
"""

from __future__ import annotations

import os
import statistics
import time
import weakref
from collections import deque
from collections.abc import Callable

import torch

INTERVAL = 0.1  # seconds between samples of the machine's running threads
WINDOW = 5  # samples a decision looks at (their median)
_PROBE_ROWS = 4  # the verify pass `same_bits` compares


def procs_running() -> int | None:
    """Threads running or ready to run on the machine now, ours included; None where unknown."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@torch.inference_mode()
def same_bits(runner, threads: int, full: int) -> bool:
    """Whether `runner`'s model gives the same logits with `threads` threads as with `full`: a single
    step and a verify pass after what the cache holds, run with each count and rolled back."""
    start = runner.length
    if start == 0 or start + 1 + _PROBE_ROWS > runner.max_len:
        return False
    tokens = torch.zeros(1 + _PROBE_ROWS, dtype=torch.long)
    before = torch.get_num_threads()
    results = []
    try:
        for count in (full, threads):
            torch.set_num_threads(count)
            one = runner.forward(tokens[:1])
            many = runner.forward(tokens[1:], last=_PROBE_ROWS)
            runner.truncate(start)
            results.append((one, many))
    finally:
        runner.truncate(start)
        torch.set_num_threads(before)
    (a1, a2), (b1, b2) = results
    return torch.equal(a1, b1) and torch.equal(a2, b2)


class ThreadGovernor:
    def __init__(self, cores: int | None = None, read: Callable[[], int | None] = procs_running,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores or usable_cores()
        self.full = torch.get_num_threads()  # the count set at start (torch's default, or the user's)
        self.read, self.clock = read, clock
        self.samples: deque[int] = deque(maxlen=WINDOW)
        self.last = float("-inf")
        self.enabled = self.full > 1 and read() is not None
        # per model: thread count -> whether it gives the full count's bits (weak: models come and go)
        self.checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def threads(self) -> int:
        return torch.get_num_threads()

    def wanted(self) -> int:
        """The thread count the recent samples ask for."""
        if len(self.samples) < WINDOW:
            return self.threads
        others = statistics.median_low(self.samples)
        return max(1, min(self.full, self.cores - others))

    def tick(self, runner=None) -> int:
        """Between decode steps: sample the machine now and then and set the thread count it asks for;
        return the count in use. A count other than the full one is only used once `same_bits` has
        shown it changes nothing in `runner`'s model."""
        if not self.enabled:
            return self.threads
        now = self.clock()
        if now - self.last < INTERVAL:
            return self.threads
        self.last = now
        running = self.read()
        if running is None:
            self.enabled = False
            return self.threads
        self.samples.append(max(0, running - self.threads))
        want = self.wanted()
        if want != self.threads and (want == self.full or self._allowed(runner, want)):
            torch.set_num_threads(want)
            self.samples.clear()  # the next decision sees the machine with the new count
        return self.threads

    def _allowed(self, runner, threads: int) -> bool:
        if runner is None:
            return False
        model = getattr(runner, "model", runner)
        try:
            known = self.checked.setdefault(model, {})
        except TypeError:  # not weakly referable: check every time
            known = {}
        if threads not in known:
            known[threads] = same_bits(runner, threads, self.full)
        return known[threads]


_GOVERNOR: ThreadGovernor | None = None


def governor() -> ThreadGovernor:
    """The process's governor (torch's thread count is the process's)."""
    global _GOVERNOR
    if _GOVERNOR is None:
        _GOVERNOR = ThreadGovernor()
    return _GOVERNOR
