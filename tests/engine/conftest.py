import pytest

from specula.engine.cpu import step as compiled


@pytest.fixture(scope="session")
def ops():
    """The compiled step's operations (built once, or found built); its tests skip where it cannot be built."""
    compiled.prepare(wait=True)
    if compiled.ops() is None:
        pytest.skip(f"the compiled step cannot be built here: {compiled.error()}")
    return compiled.ops()
