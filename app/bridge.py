"""The only door to the engine: a QObject that owns the `Runner` and turns its events into a signal.

The runner's worker thread calls the sink for every event; the sink emits `event`, and Qt queues the
emission to the GUI thread (the bridge lives there), so slots run on the GUI thread and the GUI never
waits on the engine. Importing the engine pulls in torch (seconds), so the first `load()` does that
import on a short-lived thread: the window is already painted and stays responsive meanwhile.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelChoice:
    """What to load, in the app's terms; becomes an engine LoadRequest (local) or RemoteLoadRequest
    (a server) where the engine is imported."""

    source: str = "bundled"
    draft: str = ""  # empty: no draft model
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "auto"
    measure_baseline: bool = True
    backend: str = "local"  # or "remote": connect to server_url instead of loading a model
    server_url: str = ""
    server_model: str = ""  # empty: the server's first model
    api_key_env: str = ""
    baseline_url: str = ""
    verify_tls: bool = True

    @classmethod
    def from_settings(cls, s) -> "ModelChoice":
        return cls(s.model_source, s.draft_source, s.device, s.dtype, s.weights, backend=s.backend, server_url=s.server_url,
                   server_model=s.server_model, api_key_env=s.api_key_env, baseline_url=s.baseline_url,
                   verify_tls=s.verify_tls)

    @property
    def remote(self) -> bool:
        return self.backend == "remote"

    def request(self):
        if self.remote:
            from engine.remote.backend import RemoteLoadRequest

            return RemoteLoadRequest(self.server_url, self.server_model, self.api_key_env, self.baseline_url,
                                     self.verify_tls)
        from engine.loading import ModelSpec
        from engine.session import LoadRequest

        spec = ModelSpec(self.source, device=self.device, dtype=self.dtype, weights=self.weights)
        return LoadRequest(spec, draft=self.draft or None, measure_baseline=self.measure_baseline)


class EngineBridge(QObject):
    event = Signal(object)  # an engine.events event, delivered on the GUI thread
    notice = Signal(str)  # a line for the status bar while the engine starts

    def __init__(self, session=None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._session = session  # tests pass a Session around a tiny model
        self._runner = None
        self._lock = threading.Lock()
        self._pending: list = []  # requests submitted before the runner existed
        self._starting = False
        self._closed = False
        self.current: int | None = None  # the running generation's request id
        self.event.connect(self._track)

    # -- engine side (worker threads) ---------------------------------------------------------------
    def _sink(self, event) -> None:
        if self._closed:
            return
        try:
            self.event.emit(event)
        except RuntimeError:  # the QObject is gone (the window closed while the engine ran)
            self._closed = True

    def _start_runner(self) -> None:
        """Import the engine and start its worker (runs on a helper thread)."""
        try:
            from engine.runner import Runner

            runner = Runner(sink=self._sink, session=self._session).start()
        except Exception as exc:  # an unusable install: say so in the window instead of dying
            log.exception("the engine could not start")
            from engine.events import Failed

            self._sink(Failed(0, f"the engine could not start: {exc}", type(exc).__name__))
            return
        with self._lock:
            self._runner = runner
            pending, self._pending = self._pending, []
        if self._closed:
            runner.stop(timeout=0)
            return
        for choice in pending:
            runner.submit(choice.request())

    def _ensure_runner(self) -> None:
        with self._lock:
            if self._runner is not None or self._starting:
                return
            self._starting = True
        threading.Thread(target=self._start_runner, name="specula-engine-start", daemon=True).start()

    # -- GUI side -----------------------------------------------------------------------------------
    def _track(self, event) -> None:
        if type(event).__name__ in ("Finished", "Failed") and event.request_id == self.current:
            self.current = None

    @property
    def ready(self) -> bool:
        return self._runner is not None

    def load(self, choice: ModelChoice) -> None:
        """Load a model. Answers with Loading events, then Loaded or Failed."""
        with self._lock:
            runner = self._runner
            if runner is None:
                self._pending.append(choice)
        if runner is None:
            self.notice.emit("starting the engine")
            self._ensure_runner()
        else:
            runner.submit(choice.request())

    def send(self, request) -> int:
        """Start a generation (an engine.session.GenerateRequest); returns its request id."""
        if self._runner is None:
            raise RuntimeError("the engine has not started: load a model first")
        self.current = self._runner.submit(request)
        return self.current

    def submit(self, request) -> int:
        """Any other engine request (a TrainRequest); returns its id. Its events arrive on `event`."""
        if self._runner is None:
            raise RuntimeError("the engine has not started: load a model first")
        return self._runner.submit(request)

    def cancel(self, request_id: int) -> None:
        if self._runner is not None:
            self._runner.cancel(request_id)

    def stop(self) -> None:
        """Stop the running generation (it ends with a Finished event, reason 'cancelled')."""
        if self._runner is not None and self.current is not None:
            self._runner.cancel(self.current)

    def shutdown(self, timeout: float = 2.0) -> None:
        """End the worker; a load that is still running is left to die with the process."""
        self._closed = True
        with self._lock:
            runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop(timeout=timeout)
