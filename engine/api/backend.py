"""What generates: the local engine (`serving.session.Session`) or a server (`remote.backend.RemoteBackend`).
The worker thread (`serving.worker.Worker`, behind the window and `specula serve`) and the command line
(`cli.common.open_backend`) drive either through these four calls, so a request takes one road whoever
sends it."""

from __future__ import annotations

from typing import Callable, Iterator, Protocol

from .events import Finished, Loaded, Started, Step, Trained
from .types import GenerateRequest, LoadRequest, RemoteLoadRequest, TrainRequest


class Backend(Protocol):
    def load(self, request: LoadRequest | RemoteLoadRequest, progress: Callable[[str], None] | None = None) -> Loaded:
        """Load the models (or connect to the server); what is loaded."""
        ...

    def describe(self, request_id: int = 0) -> Loaded:
        """What is loaded now: the models, device, dtype, context window and usable strategies."""
        ...

    def generate(self, request: GenerateRequest, request_id: int = 0,
                 should_stop: Callable[[], bool] = lambda: False) -> Iterator[Started | Step | Finished]:
        """The answer's events; `should_stop` is checked between steps."""
        ...

    def train(self, request: TrainRequest, request_id: int, say: Callable[[str], None],
              should_stop: Callable[[], bool]) -> Trained:
        """Train a draft head for the loaded model (local models only)."""
        ...
