"""The thread governor: fewer threads while other programs keep cores busy, never a changed bit."""

import pytest
import torch

from engine import decoder, threads
from engine.threads import WINDOW, ThreadGovernor, same_bits

from .tiny import assert_greedy_identity, loaded, perturbed, tiny_model


@pytest.fixture(autouse=True)
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


class Machine:
    """A stand-in for /proc/stat: `others` threads of other programs running, plus ours."""

    def __init__(self) -> None:
        self.others = 0
        self.now = 0.0

    def read(self) -> int:
        return self.others + torch.get_num_threads()

    def clock(self) -> float:
        self.now += 1.01 * threads.INTERVAL
        return self.now


def governed(machine: Machine, cores: int = 2) -> ThreadGovernor:
    return ThreadGovernor(cores=cores, read=machine.read, clock=machine.clock)


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
    machine.others = 1  # one busy program on two cores
    counts = [gov.tick(runner) for _ in range(WINDOW)]
    assert counts[: WINDOW - 1] == [2] * (WINDOW - 1) and counts[-1] == 1  # after a window of samples
    machine.others = 3  # never below one thread
    assert [gov.tick(runner) for _ in range(2 * WINDOW)][-1] == 1
    machine.others = 0
    assert [gov.tick(runner) for _ in range(WINDOW)][-1] == 2
    assert runner.length == 20  # the bit check rolled the cache back


def test_a_burst_shorter_than_the_window_changes_nothing(target):
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    for i in range(4 * WINDOW):
        machine.others = 1 if i % WINDOW < WINDOW // 2 else 0  # busy less than half of each window
        assert gov.tick(runner) == 2


def test_samples_are_taken_an_interval_apart():
    reads = []
    gov = ThreadGovernor(cores=2, read=lambda: reads.append(1) or 2, clock=lambda: 5.0)
    reads.clear()
    for _ in range(10):
        gov.tick()
    assert len(reads) == 1  # the clock never moved: one sample


def test_a_count_that_changes_bits_is_never_used(target, monkeypatch):
    machine, runner = Machine(), started(target)
    gov = governed(machine)
    checks = []
    monkeypatch.setattr(threads, "same_bits", lambda r, n, full: checks.append(n) or False)
    machine.others = 1
    assert [gov.tick(runner) for _ in range(3 * WINDOW)][-1] == 2
    assert checks == [1]  # checked once for this model, remembered
    assert gov.tick(None) == 2  # nothing to check with: the count stays


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
    machine.others = 3
    for _ in range(WINDOW):
        gov.tick(None)  # no runner to check bits with: samples only
    assert gov.wanted() == 5 and torch.get_num_threads() == 8


def test_greedy_answers_stay_the_targets_own_while_the_thread_count_flips(target, monkeypatch):
    """Every decode step sees a machine that swings between busy and idle: the count changes all the
    time, and prompt lookup and a draft model still give `none`'s tokens."""
    machine = Machine()
    gov = governed(machine)
    flips = []
    original = gov.tick

    def tick(runner=None):
        machine.others = 1 - machine.others if len(flips) % WINDOW == 0 else machine.others
        flips.append(original(runner))
        return flips[-1]

    monkeypatch.setattr(gov, "tick", tick)
    monkeypatch.setattr(decoder, "governor", lambda: gov)
    draft = loaded(perturbed(tiny_model(vocab=64, layers=2, seed=3), scale=0.05))
    for strategy in ("prompt-lookup", "draft-model"):
        assert_greedy_identity(target, draft, strategy, {}, trials=4, longest_prompt=40, max_new_tokens=40)
    assert {1, 2} <= set(flips)
