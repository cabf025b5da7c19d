"""The thread governor: fewer threads while other programs keep cores busy, never a changed bit."""

import time

import pytest
import torch

from specula.engine.cpu import governor as threads
from specula.engine.cpu.governor import MIN_SAMPLES, WINDOW, ThreadGovernor, same_bits
from tests.support.tiny import assert_greedy_identity, loaded, perturbed, tiny_model


@pytest.fixture(autouse=True)
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class Machine:
    """A stand-in for /proc and the clock: `others` threads of other programs running."""

    def __init__(self) -> None:
        self.others = 0
        self.now = 0.0

    def read(self) -> int:
        return self.others

    def clock(self) -> float:
        return self.now


def governed(machine: Machine, cores: int = 2) -> ThreadGovernor:
    return ThreadGovernor(cores=cores, read=machine.read, clock=machine.clock, background=False)


def look(gov: ThreadGovernor, machine: Machine, pattern: list[int]) -> None:
    """The sampler's looks, for one window, at a machine whose other programs run `pattern` threads in turn."""
    for i in range(MIN_SAMPLES + 4):
        machine.now += WINDOW / (MIN_SAMPLES + 4)
        machine.others = pattern[i % len(pattern)]
        gov.sample()


def watch(gov: ThreadGovernor, machine: Machine, pattern: list[int], runner=None) -> int:
    """`look`, then a decode step's tick."""
    look(gov, machine, pattern)
    return gov.tick(runner)


@pytest.fixture(scope="module")
def target():
    return loaded(tiny_model(vocab=64, layers=2, seed=3))


def started(target, tokens: int = 20):
    runner = target.new_runner()
    runner.forward(torch.arange(tokens) % 64)
    return runner


def test_busy_cores_take_threads_away_and_free_ones_give_them_back(target):
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    assert gov.full == 2
    assert gov.tick(runner) == 2  # no samples yet: nothing changes
    assert watch(gov, machine, [1], runner) == 1  # one busy program on two cores
    assert watch(gov, machine, [3], runner) == 1  # never below one thread
    assert watch(gov, machine, [0], runner) == 2
    assert watch(gov, machine, [1, 1, 1, 1, 0], runner) == 1  # busy four fifths of the time: a core taken
    assert runner.length == 20  # the bit check rolled the cache back


def test_a_program_that_runs_now_and_then_changes_nothing(target):
    """A window drawing the streamed tokens runs a fraction of the time; so does a burst."""
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    for pattern in ([1, 0, 0], [0, 0, 0, 0, 2], [1, 0, 1, 0, 0]):
        assert watch(gov, machine, pattern, runner) == 2


def test_old_samples_leave_the_window(target):
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    for _ in range(MIN_SAMPLES):
        machine.now += 0.01
        machine.others = 1
        gov.sample()
    machine.now += 2 * WINDOW  # the busy spell ended a while ago
    assert watch(gov, machine, [0], runner) == 2
    assert all(t >= machine.now - WINDOW for t, _ in gov.samples)


def test_what_ran_between_answers_takes_no_threads_from_the_next_one(target):
    """A program busy while no answer ran (a peer's answer in a bench) ended just before this one: the answer keeps the
    full count, where the window's old samples took a thread for most of a short answer. Load that goes on is seen
    again after MIN_SAMPLES looks, and a count chosen under it carries over to the next answer meanwhile."""
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    look(gov, machine, [2])  # the peer, while we waited
    gov.begin()
    machine.others = 0
    assert gov.tick(runner) == 2
    for _ in range(MIN_SAMPLES - 1):
        machine.now += 0.025
        gov.sample()
        assert gov.tick(runner) == 2
    assert watch(gov, machine, [1], runner) == 1  # busy during the answer: a thread given up
    gov.begin()  # the next answer, the program still busy
    assert gov.tick(runner) == 1
    assert watch(gov, machine, [1], runner) == 1


def test_a_count_that_changes_bits_is_never_used(target, monkeypatch):
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    checks = []
    monkeypatch.setattr(threads, "same_bits", lambda r, n, full: checks.append(n) or False)
    for _ in range(3):
        assert watch(gov, machine, [1], runner) == 2
    assert checks == [1]  # checked once for this model, remembered
    assert watch(gov, machine, [1], None) == 2  # nothing to check with: the count stays


def test_same_bits_compares_a_step_and_a_verify_pass_and_rolls_back(target):
    runner = started(target, 30)
    before = runner.forward(torch.tensor([7]))
    runner.truncate(30)
    assert same_bits(runner, 1, 2)  # this CPU's kernels split work, not sums, over threads
    assert runner.length == 30 and torch.equal(runner.forward(torch.tensor([7])), before)
    assert torch.get_num_threads() == 2
    assert not same_bits(target.new_runner(), 1, 2)  # an empty cache: nothing to continue


def test_one_busy_program_still_leaves_a_many_core_machine_most_threads():
    machine = Machine()
    torch.set_num_threads(8)
    gov = governed(machine, cores=8)
    watch(gov, machine, [3], None)  # no runner to check bits with: the count stays
    assert gov.wanted() == 5 and torch.get_num_threads() == 8


def test_greedy_answers_stay_the_targets_own_while_the_thread_count_flips(target, monkeypatch):
    """The machine swings between busy and idle every few decode steps: the count changes all the
    time, and prompt lookup and a draft model still give `none`'s tokens."""
    machine = Machine()
    gov = governed(machine)
    counts = []
    original = gov.tick

    def tick(runner=None):
        look(gov, machine, [len(counts) // 3 % 2])  # one busy program, then none, three steps each
        counts.append(original(runner))
        return counts[-1]

    draft = loaded(perturbed(tiny_model(vocab=64, layers=2, seed=3), scale=0.05))
    for strategy in ("prompt-lookup", "draft-model"):
        assert_greedy_identity(target, draft, strategy, {}, trials=4, longest_prompt=40, max_new_tokens=40,
                               between=lambda runner: lambda: tick(runner))
    assert {1, 2} <= set(counts)


def test_the_sampler_runs_in_the_background_while_steps_come():
    gov = ThreadGovernor(cores=2, read=lambda: 0)
    assert gov.enabled
    try:
        gov.tick()
        time.sleep(0.3)
        assert len(gov.samples) >= 2 and gov._sampler.is_alive()  # about 12 on a quiet machine
    finally:
        gov.enabled = False
        gov._wake.set()


def test_our_own_threads_are_not_counted_as_other_programs(monkeypatch):
    assert threads.own_running() >= 1  # this thread, reading its own state
    monkeypatch.setattr(threads, "procs_running", lambda: 5)
    monkeypatch.setattr(threads, "own_running", lambda: 3)
    assert threads.others_running() == 2
    monkeypatch.setattr(threads, "own_running", lambda: 7)  # read a moment apart: never below zero
    assert threads.others_running() == 0
    monkeypatch.setattr(threads, "procs_running", lambda: None)  # no /proc: unknown
    assert threads.others_running() is None


def test_a_session_on_the_cpu_consults_the_governor_before_every_decode_step(target, monkeypatch):
    import specula.engine.serving.session as session_module
    from specula.engine.api.events import Finished
    from specula.engine.api.prompts import Message
    from specula.engine.api.types import DecodeConfig, GenerateRequest
    from specula.engine.serving.session import Session

    class Counting:
        def __init__(self):
            self.runners = []

        def tick(self, runner=None):
            self.runners.append(runner)
            return 2

        def begin(self):
            self.runners.clear()

    gov = Counting()
    monkeypatch.setattr(session_module, "governor", lambda: gov)
    session = Session()
    session.use(target)
    request = GenerateRequest((Message("user", "hi"),), "none", DecodeConfig(max_new_tokens=6), chat=False)
    events = list(session.generate(request, prompt_ids=[1, 2, 3]))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.totals.steps == len(gov.runners) >= 5
    assert all(r is gov.runners[0] and r is not None for r in gov.runners)



def test_the_count_a_busy_moment_asks_for_can_be_checked_before_an_answer_needs_it(target, monkeypatch):
    """A load's warm-up checks the full count less one for the model (Session.prepare), so the first answer that
    meets another program's burst (the window drawing) switches at once instead of running the check in it."""
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    checks = []
    monkeypatch.setattr(threads, "same_bits", lambda r, n, full: checks.append(n) or True)
    gov.check_ahead(runner)
    assert checks == [1] and torch.get_num_threads() == 2  # checked; the count itself unchanged
    assert watch(gov, machine, [1], runner) == 1 and checks == [1]  # the burst: switched, no second check
    gov.check_ahead(target.new_runner())
    assert checks == [1]  # remembered per model
    gov.full = 1
    gov.check_ahead(runner)  # one thread in all: nothing to check
    assert checks == [1]
