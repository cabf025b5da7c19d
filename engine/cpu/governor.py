"""Fewer compute threads while other programs keep the CPU's cores busy.

torch's matrix kernels split each product over all their threads and wait for the slowest. When other
programs keep some cores busy, a thread that shares a core is descheduled for whole time slices and every
product waits for it: on two cores with one busy program, decoding with two threads ran at 29-53 tokens/s
and with one at 79-85 (docs/PERFORMANCE.md). So while the decoder runs, a background thread samples how
many threads other programs are running (Linux's /proc/stat `procs_running` less this process's running
threads) every INTERVAL seconds, at jittered times, and between decode steps the governor uses the cores
the others leave free on average over the last WINDOW seconds of this answer (`begin`: what ran while no answer
did is forgotten): at least one thread, at most the count it started with. Samples taken at the decoder's own step boundaries would not do: a window process drawing
the step just streamed is running exactly then, while it uses a core a tenth of the time.

Losslessness: where the thread count changes a product's bits, an answer decoded while the count
changed would not be the target's own greedy answer. Before a model first runs with another count,
`same_bits` checks a single step and a verify pass bit for bit against the full count on the runner's
own cache (then rolls it back); where they differ, that count is never used for that model.
"""

from __future__ import annotations

import os
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

import torch

INTERVAL = 0.025  # mean seconds between samples of the machine's running threads (jittered +-50%)
WINDOW = 0.5  # seconds of samples a decision looks at: their mean, after at least MIN_SAMPLES
MIN_SAMPLES = 12
BUSY = 0.75  # the share of the window other programs must run on a core to take it from us
IDLE = 2.0  # the sampler sleeps when no decode step came for this long
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


def own_running() -> int:
    """This process's threads running or ready to run now (state R in /proc/self/task/*/stat)."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        end = stat.rfind(b")")  # the name, in parentheses, may hold spaces
        n += stat[end + 2 : end + 3] == b"R"
    return n


def others_running() -> int | None:
    """Threads of other programs running or ready to run now; None where unknown. Our own threads are
    left out, the server's and the drafters' as well as torch's (a thread streaming the last step's
    events is busy just when the decoder samples)."""
    total = procs_running()
    return None if total is None else max(0, total - own_running())


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
    def __init__(self, cores: int | None = None, read: Callable[[], int | None] = others_running,
                 clock: Callable[[], float] = time.monotonic, background: bool = True) -> None:
        self.cores = cores or usable_cores()
        self.full = torch.get_num_threads()  # the count set at start (torch's default, or the user's)
        self.read, self.clock = read, clock
        self.samples: deque[tuple[float, int]] = deque()  # (time, others running), the last WINDOW seconds
        self.enabled = self.full > 1 and read() is not None
        # per model: thread count -> whether it gives the full count's bits (weak: models come and go)
        self.checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.background = background
        self._sampler: threading.Thread | None = None
        self._wake = threading.Event()
        self._lock = threading.Lock()  # the samples, between the sampler and the decoder's thread
        self._last_tick = float("-inf")

    @property
    def threads(self) -> int:
        return torch.get_num_threads()

    def sample(self) -> None:
        """One look at the machine (the background sampler's; tests call it directly)."""
        others = self.read()
        if others is None:
            self.enabled = False
            return
        now = self.clock()
        with self._lock:
            self.samples.append((now, others))
            while self.samples[0][0] < now - WINDOW:
                self.samples.popleft()

    def wanted(self) -> int:
        """The thread count the recent samples ask for."""
        with self._lock:
            recent = list(self.samples)
        if len(recent) < MIN_SAMPLES:
            return self.threads
        # a core counts as taken when others ran on it at least BUSY of the window: a program that
        # draws now and then (the window) leaves it to us
        others = int(sum(n for _, n in recent) / len(recent) + 1 - BUSY)
        return max(1, min(self.full, self.cores - others))

    def begin(self) -> None:
        """An answer starts: forget the samples taken while none ran. Another program's work that ended before this
        answer (a peer's answer in a bench, a compile, the window drawing) would otherwise take threads for the first
        WINDOW seconds of it, most of a short answer; work that goes on is seen again within MIN_SAMPLES looks, and
        the count chosen under it carries over from the last answer meanwhile."""
        with self._lock:
            self.samples.clear()

    def tick(self, runner=None) -> int:
        """Between decode steps: set the thread count the recent samples ask for; return the count in
        use. A count other than the full one is only used once `same_bits` has shown it changes nothing
        in `runner`'s model."""
        if not self.enabled:
            return self.threads
        self._last_tick = self.clock()
        if self.background:
            self._start_sampler()
        want = self.wanted()
        if want != self.threads and (want == self.full or self._allowed(runner, want)):
            torch.set_num_threads(want)
            with self._lock:
                self.samples.clear()  # the next decision sees the machine with the new count
        return self.threads

    def check_ahead(self, runner) -> None:
        """Check now, for `runner`'s model, the count one other busy program would leave (the full count less
        one): its check and the first products at that count (each count's first run is slower) are then paid
        before an answer rather than in the first one that meets a busy moment."""
        if self.enabled and self.full > 1 and runner is not None and runner.device.type == "cpu":
            self._allowed(runner, self.full - 1)

    def _start_sampler(self) -> None:
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample_forever, name="specula-load", daemon=True)
            self._sampler.start()
        self._wake.set()

    def _sample_forever(self) -> None:
        while self.enabled:
            if self.clock() - self._last_tick > IDLE:  # no answer running: sleep until the next step
                self._wake.clear()
                self._wake.wait()
                with self._lock:
                    self.samples.clear()
            self.sample()
            time.sleep(INTERVAL * random.uniform(0.5, 1.5))  # jittered: no beat with the decoder's steps

    def _allowed(self, runner, threads: int) -> bool:
        if runner is None:
            return False
        known = self.checked.setdefault(getattr(runner, "model", runner), {})
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
