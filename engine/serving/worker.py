"""The worker thread that owns the models: requests in, events out, cancel between steps.

    worker = Worker(); worker.start()
    rid = worker.submit(LoadRequest(...))          # -> Loading..., Loaded | Failed
    rid = worker.submit(RemoteLoadRequest(URL))    # the same, for a server (remote backend)
    rid = worker.submit(GenerateRequest(...))      # -> Started, Step..., Finished | Failed
    rid = worker.submit(TrainRequest(...))         # -> Training..., Trained, Loaded | Failed
    worker.cancel(rid)                             # takes effect before the next engine step
    event = worker.events.get()                    # a thread-safe queue (or pass `sink=`)

Every exception inside a request becomes a `Failed` event with a one-line message; the thread lives on
and the next request may use another strategy without reloading the target.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from dataclasses import replace
from typing import Callable

from ..api.backend import Backend
from ..api.errors import SpeculaError
from ..api.events import Failed, Finished, Loading, Totals, Training
from ..api.types import GenerateRequest, LoadRequest, RemoteLoadRequest, TrainRequest
from ..remote.backend import RemoteBackend
from .session import Session

log = logging.getLogger(__name__)
_STOP = object()


def describe_error(exc: BaseException) -> str:
    """One line a user can act on."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory: try a smaller model, a shorter prompt, fewer new tokens or dtype bf16/fp16"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, SpeculaError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Worker:
    def __init__(self, sink: Callable[[object], None] | None = None, session: Session | None = None) -> None:
        self.session = session or Session()  # the local engine
        self.backend: Backend = self.session  # what generates: the local session or a remote server
        self.events: queue.Queue = queue.Queue()
        self.sink = sink or self.events.put  # where its events go: its queue, or what its owner gives (a service)
        self._jobs: queue.Queue = queue.Queue()
        self._ids = itertools.count(1)
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()
        self._current: int | None = None
        self._thread = threading.Thread(target=self._loop, name="specula-engine", daemon=True)

    def start(self) -> "Worker":
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel what runs, drop what waits, and end the thread."""
        self.cancel()
        self._jobs.put(_STOP)
        self._thread.join(timeout)

    @property
    def busy(self) -> bool:
        return self._current is not None or not self._jobs.empty()

    def submit(self, request: LoadRequest | GenerateRequest) -> int:
        rid = next(self._ids)
        self._jobs.put((rid, request))
        return rid

    def cancel(self, request_id: int | None = None) -> None:
        """Cancel one request (queued or running), or with no id the running one and all queued."""
        with self._lock:
            if request_id is not None:
                self._cancelled.add(request_id)
                return
            if self._current is not None:
                self._cancelled.add(self._current)
            pending = []
            while True:
                try:
                    pending.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            for job in pending:
                if job is _STOP:
                    self._jobs.put(job)
                else:
                    self._cancelled.add(job[0])
                    self._jobs.put(job)

    def _is_cancelled(self, rid: int) -> bool:
        return rid in self._cancelled

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            rid, request = job
            with self._lock:
                self._current = rid
            try:
                self._run(rid, request)
            except Exception as exc:  # the worker survives every request
                log.debug("request %s failed", rid, exc_info=True)
                self.sink(Failed(rid, describe_error(exc), type(exc).__name__))
            finally:
                with self._lock:
                    self._current = None
                    self._cancelled.discard(rid)

    def _run(self, rid: int, request) -> None:
        if isinstance(request, (LoadRequest, RemoteLoadRequest)):
            self._load(rid, request)
            return
        if isinstance(request, TrainRequest):
            trained = self.backend.train(request, rid, lambda text: self.sink(Training(rid, text)),
                                         lambda: self._is_cancelled(rid))
            self.sink(trained)
            self.sink(self.backend.describe(rid))  # the strategy list now offers the new head
            return
        if not isinstance(request, GenerateRequest):
            raise SpeculaError(f"unknown request type {type(request).__name__}")
        if self._is_cancelled(rid):
            self.sink(Finished(rid, "cancelled", "", (), Totals(0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0)))
            return
        for event in self.backend.generate(request, rid, lambda: self._is_cancelled(rid)):
            self.sink(event)

    def _load(self, rid: int, request) -> None:
        """Load a local model or connect to a server; a failure keeps the backend in use before it."""
        say = lambda text: self.sink(Loading(rid, text))  # noqa: E731
        if isinstance(request, RemoteLoadRequest):
            backend: Backend = RemoteBackend()
            loaded = backend.load(request, say)
            self.session.unload()  # the local model's memory is given back; loading it again reloads
        else:
            backend = self.session
            loaded = backend.load(request, say)
        self.backend = backend
        self.sink(replace(loaded, request_id=rid))
