"""The cyclic collector held off while imports and a model's load make their many objects (api/collector.py)."""

import gc
import time
import weakref

import pytest

from specula.engine.api import collector


class Cycle:
    def __init__(self):
        self.me = self


@pytest.fixture
def fresh(monkeypatch):
    """The collector's switch is the process's: a model still loading in another thread (a worker an earlier test
    left) holds it off until its load ends. Wait for that (generously), then start as a fresh process."""
    from specula.engine.cpu import governor

    deadline = time.monotonic() + 120
    while not gc.isenabled() and time.monotonic() < deadline:
        time.sleep(0.05)
    # the thread governor's sampler (started by an earlier test's answer) samples the machine for IDLE seconds after
    # an answer's last step, making and freeing objects the test would see leave the frozen ones: wait until it sleeps
    sampler = governor._GOVERNOR
    while sampler is not None and sampler.clock() - sampler._last_tick < governor.IDLE + 1.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    gc.enable()
    monkeypatch.setattr(collector, "_froze", False)
    yield
    gc.unfreeze()
    gc.enable()


def test_no_collection_inside_one_after_it_and_none_inside_an_outer_block(fresh):
    with collector.collected_after():
        assert not gc.isenabled()
        garbage = weakref.ref(Cycle())  # unreachable in a cycle: only the collector frees it
        with collector.collected_after():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block leaves it to the outer one
        for _ in range(3000):
            [Cycle() for _ in range(10)]  # far past the allocations that would start a collection
        assert garbage() is not None
    assert gc.isenabled()
    assert garbage() is None  # collected at the end
    with pytest.raises(RuntimeError):
        with collector.collected_after():
            raise RuntimeError("a failed load")
    assert gc.isenabled()


def test_the_first_imports_are_frozen_once_and_later_blocks_freeze_nothing(fresh):
    before = gc.get_freeze_count()
    with collector.collected_after(freeze=True):
        pass
    frozen = gc.get_freeze_count()
    assert frozen > before and gc.isenabled()
    later = weakref.ref(Cycle())
    kept = [Cycle() for _ in range(1000)]  # a second freeze would take these in
    with collector.collected_after(freeze=True):
        pass
    # not again in this process (another thread, such as the thread governor's sampler or tqdm's monitor, may free a
    # few frozen objects meanwhile: the count can fall, it cannot grow by a freeze's worth)
    assert gc.get_freeze_count() < frozen + len(kept)
    gc.collect()
    assert later() is None  # what came after the first freeze is collected as before
