"""The engine's server in a thread of the test process: the desktop app's tests run their engine so
(around a Session of tiny models), and the server's tests their server."""

from __future__ import annotations

import secrets
import threading
import time

from specula.engine.cli.serve import bind


class ServerThread:
    """An app of `specula serve` on a loopback port the system picks, run by uvicorn in a thread of this
    process."""

    def __init__(self, app) -> None:
        """`app`: the ASGI app, or a function of the port it will listen on that makes it."""
        import uvicorn

        from specula.engine.serving.guard import Protocol

        sock = bind("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if not hasattr(app, "router"):  # a Starlette app has one; a maker does not
            app = app(self.port)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", http=Protocol))
        self.done = threading.Event()

        def run() -> None:
            try:
                self.server.run(sockets=[sock])
            finally:
                self.done.set()

        threading.Thread(target=run, name="specula-server-thread", daemon=True).start()
        while not self.server.started and not self.done.is_set():
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True


class ThreadEngine:
    """The window's engine as a server on a thread of this process, around a given Session (an
    `EngineBridge(engine=lambda: ThreadEngine(session))`)."""

    def __init__(self, session) -> None:
        self.session = session
        self.server = None

    def start(self) -> tuple[str, str]:
        from specula.engine.serving.routes import create_app
        from specula.engine.serving.worker import Worker
        from specula.engine.serving.service import EngineService

        key = secrets.token_urlsafe(16)
        self.server = ServerThread(create_app(EngineService(Worker(session=self.session)), strategy="none", api_key=key))
        return self.server.url, key

    def wait(self) -> int:
        if self.server is not None:
            self.server.done.wait()
        return 0

    pid = None  # no process of its own

    def exit_code(self, within_s: float) -> int | None:
        return None  # it never dies apart from this process

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
