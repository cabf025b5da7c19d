"""`specula serve`: the engine behind an OpenAI-compatible server (docs/SERVER.md)."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from ..api.errors import SpeculaError, terminal_safe
from ..api.paths import use_data_dir
from ..api.strategies import STRATEGIES
from ..api.types import DecodeConfig, GenerateRequest, LoadRequest
from ..remote.http import is_loopback

MIN_KEY_CHARS = 8  # an API key shorter than this is guessed too soon


def api_key_from(env_name: str | None) -> str | None:
    """The key in environment variable `env_name`: a one-line error when it is named but unset, or when the key
    is one no client could send (see check_key)."""
    if not env_name:
        return None
    key = os.environ.get(env_name, "").strip()
    if not key:
        raise SpeculaError(f"--api-key-env {env_name}: that environment variable is not set or empty")
    check_key(key, f"--api-key-env {env_name}")
    return key


def check_key(key: str, where: str) -> None:
    """A one-line error for a key that is short or not visible ASCII: a header's bytes reach the server as
    Latin-1 text, so a client's UTF-8 key (é, ü, ...) never equals the key as the server holds it, and spaces
    or control characters do not survive a header."""
    if not all("!" <= c <= "~" for c in key):
        raise SpeculaError(f"{where}: the key holds a character other than visible ASCII (letters, digits and "
                           "punctuation, no spaces), which no client can send in a header as it is")
    if len(key) < MIN_KEY_CHARS:
        raise SpeculaError(f"{where}: the key has {len(key)} characters; use at least {MIN_KEY_CHARS}")


def check_host(host: str) -> None:
    """A one-line error for a --host that is not an address or a name that resolves."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) and exc.strerror else "not a valid host name"
        raise SpeculaError(f"--host {host!r} cannot be resolved to an address ({reason})") from None


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port), with a clear error when the address is taken."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise SpeculaError(f"--host {host}: not an address of this machine") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise SpeculaError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    return sock


def watch_parent(poll_s: float = 0.5) -> None:
    """End this process when its parent ends (the app that started it was closed or killed): the
    parent's id changes when it dies, on every platform."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="specula-parent-watch", daemon=True).start()


def run_serve(args) -> int:
    import uvicorn

    from ..remote.keys import check_env_name
    from ..serving.guard import Protocol
    from ..serving.routes import create_app
    from ..serving.service import EngineService
    from .common import model_choice

    if args.strategy not in STRATEGIES and args.strategy != "server":
        raise SpeculaError(f"--strategy {args.strategy}: unknown strategy; choose one of {', '.join(STRATEGIES)}")
    check_host(args.host)
    key = api_key_from(args.api_key_env)
    if not is_loopback(args.host) and key is None:
        raise SpeculaError(f"--host {args.host} lets other machines in: set an API key with --api-key-env VAR")
    if args.k is not None and not 1 <= args.k:
        raise SpeculaError("--k must be at least 1")
    if not 0 < args.max_body_mb <= 1024:
        raise SpeculaError("--max-body-mb must be above 0 and at most 1024")
    for name in args.allow_key_env:
        check_env_name(name)
    if args.data_dir is not None:
        use_data_dir(args.data_dir)
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    initial = None if args.no_model else LoadRequest(model_choice(args),
                                                      args.draft_model, measure_baseline=not args.no_baseline,
                                                      draft_head=args.draft_head, prepare=first_answer(args))
    service = EngineService(on_load_failure=load_failed)
    app = create_app(service, model_aliases=(args.model,), strategy=args.strategy, k=args.k, api_key=key,
                     initial=initial, port=port, max_body=int(args.max_body_mb * (1 << 20)), max_queue=args.max_queue,
                     allow_servers=tuple(args.allow_server), allow_key_envs=tuple(args.allow_key_env),
                     max_active=args.max_queue + 64)
    if args.exit_with_parent:
        watch_parent()
    what = "no model yet" if initial is None else f"loading {args.model}; GET /health says when it is ready"
    print(f"specula serve: http://{shown}:{port}/v1 ({what})", file=sys.stderr, flush=True)
    if args.announce:
        print(json.dumps({"url": f"http://{shown}:{port}"}), flush=True)
    # h11 with a deadline for request heads (guard.Protocol); requests beyond the queue's room get a JSON 503
    # from guard.Guard (uvicorn's own limit would answer in plain text)
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2, http=Protocol)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def load_failed(message: str) -> None:
    """A load that failed, on the server's terminal: the model it was started with too, where it stays up (a load
    request may bring another)."""
    print(f"specula serve: the load failed: {terminal_safe(message)}", file=sys.stderr, flush=True)


def first_answer(args) -> GenerateRequest | None:
    """An answer as requests that name no strategy will ask, run as the model loads (the first request
    then runs at the speed of the next)."""
    if args.strategy == "server":
        return None
    return GenerateRequest((), args.strategy, DecodeConfig.for_strategy(args.strategy, args.k))
