import pytest

from specula.engine.cpu import step as compiled


@pytest.fixture(scope="session")
def ops():
    """The compiled step's operations (built once, or found built); its tests skip where it cannot be built."""
    compiled.prepare(wait=True)
    if compiled.ops() is None:
        pytest.skip(f"the compiled step cannot be built here: {compiled.error()}")
    return compiled.ops()


@pytest.fixture()
def one_torch_thread():
    """The test runs on one intra-op thread (tests/support/tiny.py: one_torch_thread)."""
    from tests.support.tiny import one_torch_thread

    with one_torch_thread():
        yield
