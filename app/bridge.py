"""The only door to the engine: a QObject that runs the engine in a process of its own (`specula serve`
on a loopback port, with a random key) and turns what its client streams into a signal.

Each request runs on a short-lived thread that reads its stream (`specula.engine.remote.client`) and
emits `event`; Qt queues the emission to the GUI thread (the bridge lives there), so slots run on the GUI
thread and the GUI never waits on the engine. The window's process never imports torch: the engine's events and
request types are plain dataclasses (`specula.engine.api.events`, `specula.engine.api.types`).

If the engine process dies (killed, out of memory, a crash in a kernel) the running request ends with
a `Failed` event that says so, the engine is started again in the background and the last model is
loaded again; the conversation is the window's and is kept. The engine process ends with the window,
also when the window is killed (`specula serve --exit-with-parent`).

Tests pass an `engine` of their own (tests/support/engines.py: the same server on a thread of this process,
around a Session of tiny models).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
from typing import Callable

from PySide6.QtCore import QObject, Signal

from specula.engine.api.events import Failed, Finished, Totals  # plain dataclasses: no torch

log = logging.getLogger(__name__)
START_TIMEOUT_S = 60.0
KEY_ENV = "SPECULA_ENGINE_KEY"


class EngineDied(RuntimeError):
    pass


class ChildEngine:
    """`specula serve` as a child process: loopback, any free port, a random key, no model until asked."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.key = secrets.token_urlsafe(24)

    def start(self) -> tuple[str, str]:
        env = {**os.environ, KEY_ENV: self.key}
        # a bundle (PyInstaller) has no `python -m`: its executable runs the command line after --engine
        engine = [sys.executable, "--engine"] if getattr(sys, "frozen", False) else [sys.executable, "-m", "specula.engine.cli"]
        command = engine + ["serve", "--no-model", "--port", "0", "--api-key-env", KEY_ENV, "--announce",
                            "--exit-with-parent"]
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        line = self.proc.stdout.readline()  # {"url": ...} once it listens; empty if it died first
        if not line:
            detail = self.proc.stderr.read().strip().splitlines()
            raise EngineDied(detail[-1] if detail else f"exit code {self.proc.wait()}")
        self.url = json.loads(line)["url"]
        threading.Thread(target=self._drain, name="specula-engine-log", daemon=True).start()
        return self.url, self.key

    def _drain(self) -> None:
        """Keep the child's pipes from filling up; its log lines go to this process's log."""
        proc = self.proc
        for line in proc.stderr:
            log.info("engine: %s", line.rstrip())

    def wait(self) -> int:
        """Block until the process ends; its exit code."""
        return self.proc.wait() if self.proc is not None else 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def exit_code(self, within_s: float) -> int | None:
        """The process's exit code if it ends within `within_s` seconds; None while it runs."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(within_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()


class EngineBridge(QObject):
    event = Signal(object)  # an specula.engine.api.events event, delivered on the GUI thread
    notice = Signal(str)  # a line for the status bar while the engine starts
    restarting = Signal()  # the engine process stopped on its own: another starts and loads the model again

    def __init__(self, parent: QObject | None = None, engine: Callable[[], object] | None = None) -> None:
        """`engine` makes the engine to talk to (start, wait, stop, pid, exit_code), again after it dies:
        by default a `specula serve` child process (tests pass one around a tiny model in this process)."""
        super().__init__(parent)
        self._make_engine = engine or ChildEngine
        self._engine = None
        self._client = None
        self._lock = threading.Lock()
        self._pending: list = []  # (id, request) submitted before the engine was up
        self._starting = False
        self._closed = False
        self._ids = itertools.count(1)
        self._calls: dict[int, object] = {}  # request id -> specula.engine.remote.client.Call, while it streams
        self._last_load = None  # the last LoadRequest or RemoteLoadRequest: loaded again after a restart
        self.current: int | None = None  # the running generation's request id
        self.restarts = 0  # times the engine process died and was started again
        self.died_code: int | None = None
        self.event.connect(self._track)

    # -- engine side (worker threads) ---------------------------------------------------------------
    def _emit(self, event) -> None:
        if self._closed:
            return
        try:
            self.event.emit(event)
        except RuntimeError:  # the QObject is gone (the window closed while the engine ran)
            self._closed = True

    def _start_engine(self) -> None:
        """Start the engine process and its client (on a helper thread), then send what waited."""
        from specula.engine.remote.client import EngineClient

        engine = self._make_engine()
        try:
            url, key = engine.start()
            client = EngineClient(url, key)
        except Exception as exc:  # an unusable install: say so in the window instead of dying
            log.exception("the engine could not start")
            with self._lock:
                self._starting = False
                pending, self._pending = self._pending, []
            for rid, _ in pending or [(0, None)]:
                self._emit(Failed(rid, f"the engine could not start: {exc}", "EngineDied"))
            return
        with self._lock:
            self._engine = engine
        if self._closed:
            engine.stop()
            return
        threading.Thread(target=self._watch, args=(engine,), name="specula-engine-watch", daemon=True).start()
        # what waited goes first, one request after another and each to its end (the model's load before the
        # message sent meanwhile: a busy machine must not let the message reach the engine first); the
        # client is used directly only once nothing waits, and requests made until then wait behind these
        while True:
            with self._lock:
                died = engine is not self._engine  # _watch saw it end and asked for another
                if died or not self._pending:
                    if not died:
                        self._client = client
                    self._starting = False
                    break
                rid, request = self._pending.pop(0)
                call = client.call(request, rid)
                self._calls[rid] = call
            self._stream(rid, call, engine)
        if died and self._pending:
            self._ensure_engine()

    def _watch(self, engine) -> None:
        """Wait for the engine process to end; if nobody asked it to, start another and load the last
        model again (a request that was running ends with a Failed event of its own, see _stream)."""
        code = engine.wait()
        with self._lock:
            if self._closed or engine is not self._engine:
                return
            self._engine = self._client = None
        self.restarts += 1
        self.died_code = code
        self.notice.emit(f"the engine process stopped (exit code {code}); restarting it")
        if self._last_load is not None:
            self.restarting.emit()
            self.load(self._last_load)

    def _run(self, rid: int, request) -> None:
        with self._lock:
            client = self._client
        if client is None:
            with self._lock:
                self._pending.append((rid, request))
            self._ensure_engine()
            return
        call = client.call(request, rid)
        with self._lock:
            self._calls[rid] = call
            engine = self._engine
        threading.Thread(target=self._stream, args=(rid, call, engine), name=f"specula-request-{rid}",
                         daemon=True).start()

    def _stream(self, rid: int, call, engine) -> None:
        try:
            for event in call.events():
                if isinstance(event, Failed) and event.kind == "EngineUnreachable":
                    code = engine.exit_code(within_s=2.0)
                    if code is not None:  # the engine died under this request
                        event = Failed(rid, f"the engine process stopped (exit code {code}) during this request; "
                                            "it is starting again", "EngineDied")
                self._emit(event)
        finally:
            with self._lock:
                self._calls.pop(rid, None)

    def _ensure_engine(self) -> None:
        with self._lock:
            if self._client is not None or self._starting:
                return
            self._starting = True
        self.notice.emit("starting the engine")
        threading.Thread(target=self._start_engine, name="specula-engine-start", daemon=True).start()

    # -- GUI side -----------------------------------------------------------------------------------
    def _track(self, event) -> None:
        if isinstance(event, (Finished, Failed)) and event.request_id == self.current:
            self.current = None

    @property
    def ready(self) -> bool:
        return self._client is not None

    @property
    def engine_pid(self) -> int | None:
        return self._engine.pid if self._engine is not None else None

    def load(self, request) -> int:
        """Load a model (a LoadRequest) or connect to a server (a RemoteLoadRequest, which the engine process
        relays; `Settings.load_request` makes either). Answers with Loading events, then Loaded or Failed."""
        self._last_load = request
        rid = next(self._ids)
        self._run(rid, request)
        return rid

    def send(self, request) -> int:
        """Start a generation (an specula.engine.api.types.GenerateRequest); returns its request id. While the engine
        (re)starts it waits, behind the model's load."""
        self.current = next(self._ids)
        self._run(self.current, request)
        return self.current

    def train(self, request) -> int:
        """Train a draft head (a TrainRequest, the engine's one request besides loads and answers); returns its
        id. Its events arrive on `event`."""
        rid = next(self._ids)
        self._run(rid, request)
        return rid

    def cancel(self, request_id: int) -> None:
        with self._lock:
            call = self._calls.get(request_id)
            waiting = [job for job in self._pending if job[0] == request_id]
            for job in waiting:
                self._pending.remove(job)
        if call is not None:
            call.close()
        for rid, _ in waiting:  # never sent: it ends here, as the engine ends a cancelled request
            self._emit(Finished(rid, "cancelled", "", (), Totals(0, 0, 0, 0, 0, 0.0, 0.0, 0.0, 0.0)))

    def stop(self) -> None:
        """Stop the running generation (it ends with a Finished event, reason 'cancelled')."""
        if self.current is not None:
            self.cancel(self.current)

    def shutdown(self, timeout: float = 2.0) -> None:
        """End the engine process (what runs there ends with it)."""
        self._closed = True
        with self._lock:
            engine, self._engine, self._client = self._engine, None, None
            calls = list(self._calls.values())
        for call in calls:
            call.close()
        if engine is not None:
            engine.stop()

