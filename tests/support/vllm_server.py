"""A real vLLM (CPU) server for the remote backend's integration tests, run as `make vllm-server` runs it.

`start_servers(specs)` sets up the servers' environment when it is missing (a few minutes, once), starts
`scripts/vllm-server.sh` on a free loopback port per server and waits until they answer. Where that is impossible
(no package index, an unsupported machine), it raises `Unavailable` with the reason, and the tests skip
with that reason printed (pytest -rs), never passing silently.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUP_TIMEOUT_S = 900
START_TIMEOUT_S = 420  # a busy 2-core machine


class Unavailable(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


_background: tuple[subprocess.Popen, Path] | None = None  # a setup started early (start_setup)
_early: tuple[threading.Thread, list[str], list] | None = None  # servers started once that setup is done


def start_setup(log: Path, specs: list[str] | None = None) -> None:
    """Begin setting up in the background, so that the rest of the test run goes on meanwhile; `setup`
    then waits for it. With `specs`, servers of those settings start as soon as the setup is done (a start
    is about a minute of imports and loading; an idle server then uses about 1% of a core), and
    `start_servers` takes them."""
    global _background, _early
    if os.environ.get("SPECULA_SKIP_VLLM") or _background is not None:
        return
    with open(log, "wb") as out:
        _background = (popen_owned(["sh", "scripts/vllm-server.sh", "--setup"], cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT), log)
    if specs:
        started: list[ServerProcess] = []

        def start_when_set_up() -> None:
            try:
                if _background[0].wait(timeout=SETUP_TIMEOUT_S) == 0:
                    started.extend(ServerProcess(spec, log.parent / f"vllm-{spec}.log") for spec in specs)
            except subprocess.TimeoutExpired:
                pass  # `setup` says so

        thread = threading.Thread(target=start_when_set_up, name="vllm-early-start", daemon=True)
        thread.start()
        _early = (thread, list(specs), started)


def setup(log: Path) -> None:
    if os.environ.get("SPECULA_SKIP_VLLM"):
        raise Unavailable("SPECULA_SKIP_VLLM is set")
    if _background is not None:
        proc, early_log = _background
        try:
            code = proc.wait(timeout=SETUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise Unavailable(f"setting up vLLM took over {SETUP_TIMEOUT_S} s") from None
        if code != 0:
            raise Unavailable(f"setting up vLLM failed: {_tail(early_log)}")
        return
    with open(log, "wb") as out:
        try:
            done = subprocess.run(["sh", "scripts/vllm-server.sh", "--setup"], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=SETUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"setting up vLLM took over {SETUP_TIMEOUT_S} s") from None
    if done.returncode != 0:
        raise Unavailable(f"setting up vLLM failed: {_tail(log)}")


# a watchdog beside each server, in the server's own session: when the process that started the server
# is gone (the test run ended or was killed, even with kill -9), it kills the server's whole group
WATCHDOG = """
import os, signal, sys, time
owner, group = int(sys.argv[1]), int(sys.argv[2])
while True:
    time.sleep(0.5)
    try:
        os.kill(owner, 0)
        os.killpg(group, 0)
    except ProcessLookupError:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break
"""


def popen_owned(command: list[str], **kwargs) -> subprocess.Popen:
    """Start `command` in a session of its own (so that it can be killed as a group) that does not
    outlive this process: a watchdog kills the group once this process is gone."""
    proc = subprocess.Popen(command, start_new_session=True, **kwargs)
    subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(proc.pid)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc


class ServerProcess:
    def __init__(self, spec: str, log: Path) -> None:
        self.spec, self.log = spec, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # no compilation: up in about 30 s instead of 90 (its steps are slower, which these tests do not time)
        env = {**os.environ, "PORT": str(self.port), "SPEC": spec, "VLLM_ARGS": "--enforce-eager"}
        env.pop("OMP_NUM_THREADS", None)  # the server sets its own threads
        self._out = open(log, "wb")
        self.proc = popen_owned(["sh", "scripts/vllm-server.sh"], cwd=ROOT, env=env, stdout=self._out,
                                stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(f"vLLM exited while starting: {_tail(self.log)}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(1.0)
        self.kill()
        raise Unavailable(f"vLLM did not answer within {START_TIMEOUT_S} s: {_tail(self.log)}")

    def kill(self) -> None:
        """Kill the server and its engine processes at once (as a crash would)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self._out.close()


def start_servers(specs: list[str], log_dir: Path) -> list[ServerProcess]:
    """Servers of these speculation settings, started side by side (a start is mostly waiting on imports
    and loading, so two take little longer than one)."""
    early = _early if _early is not None and _early[1] == list(specs) else None
    if early is not None:
        early[0].join(SETUP_TIMEOUT_S + 60)
    setup(log_dir / "vllm-setup.log")
    servers = (early[2] if early is not None and early[2]
               else [ServerProcess(spec, log_dir / f"vllm-{spec}.log") for spec in specs])
    try:
        for server in servers:
            server.wait_ready()
    except Unavailable:
        for server in servers:
            server.kill()
        raise
    return servers
