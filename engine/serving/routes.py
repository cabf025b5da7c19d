"""The HTTP routes of `specula serve` (Starlette under uvicorn).

    GET  /health                        200 once a model is loaded, else 503 (with the state)
    GET  /v1/models                     OpenAI's model list
    GET  /v1/models/{id}                one model (404 for another name)
    POST /v1/chat/completions           OpenAI's chat completions, streamed or not, with the extension
    POST /v1/completions                OpenAI's (legacy) completions on a raw prompt
    GET  /metrics                       Prometheus text (prometheus.py)
    GET  /specula/v1/status             the loaded model, the engine's state, the queue
    GET  /specula/v1/strategies         every strategy, and whether the loaded model can use it
    POST /specula/v1/load               load or switch the model; streams progress (server-sent events)
    POST /specula/v1/train              train a draft head; streams progress; closing the stream cancels
    POST /specula/v1/requests/{id}/cancel   cancel a queued or running request

Before a route sees a request, guard.Guard refuses web pages, requests without the API key where one is set
(every route but /health; from the headers, before a body is read or a place counted), oversized and slow
bodies, and (without a key) requests not addressed to a loopback name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
from typing import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..api import wire
from ..api.errors import SpeculaError
from ..api.events import (
    Failed,
    Finished,
    Loaded,
    Loading,
    PromptProgress,
    ServerStats,
    Started,
    Step,
    Trained,
    Training,
)
from ..api.strategies import STRATEGIES
from ..api.types import LoadRequest, RemoteLoadRequest
from . import openai, prometheus
from .guard import MAX_ACTIVE, MAX_BODY_BYTES, Guard
from .service import EngineService

log = logging.getLogger(__name__)
CONTROL = "/specula/v1"
MAX_QUEUE = 16  # generation requests waiting behind the running one; more are refused with 429


def _error(exc: openai.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def _body(request: Request) -> object:
    try:
        body = await request.json()
    except RecursionError:
        raise openai.ApiError(400, "the request body nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and an integer past Python's digit limit
        if "digits" in str(exc) and not isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
            raise openai.ApiError(400, f"a number in the request body has more than {sys.get_int_max_str_digits():,} "
                                       "digits") from None
        raise openai.ApiError(400, "the request body is not valid JSON") from None
    where = _lone_surrogate(body)
    if where is not None:
        raise openai.ApiError(400, f"'{where}' holds a lone UTF-16 surrogate (an escape such as \\ud800 that is "
                                   "half of a character): it is not text", param=where or None)
    return body


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: object, path: str = "") -> str | None:
    """The path (e.g. messages[0].content) of the first key or string in a parsed body that holds a lone
    surrogate (JSON's \\ud800 escapes decode to one where no pair follows), else None. Such a string cannot be
    encoded, tokenized or echoed in an error message."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{path}.{key}" if path else str(key)
            if _SURROGATE.search(key):
                return f"{path} (one of its keys)" if path else "the body (one of its keys)"
            found = _lone_surrogate(item, inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _watch_disconnect(request: Request, on_gone: Callable[[], None]) -> asyncio.Task:
    """A task that calls `on_gone` as soon as the client closes its connection (the body has been read, so
    the next message from the client is its disconnect); cancel it when the answer is sent."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        on_gone()

    return asyncio.get_running_loop().create_task(watch())


def create_app(service: EngineService, *, model_aliases: tuple[str, ...] = (), strategy: str = "auto",
               k: int | None = None, api_key: str | None = None, initial: LoadRequest | None = None,
               port: int | None = None, max_body: int = MAX_BODY_BYTES, max_queue: int = MAX_QUEUE,
               allow_servers: tuple[str, ...] = (), allow_key_envs: tuple[str, ...] = (),
               max_active: int = MAX_ACTIVE) -> Starlette:
    """The ASGI app. `initial` is loaded when the server starts (requests queue behind it). `port`: the
    port it listens on (a keyless server answers only Host loopback:port). `allow_servers`: servers any
    caller may relay; with a key, the key's holders may name others. `allow_key_envs`: environment
    variables a load request may name as a relayed server's key (none by default)."""

    def defaults() -> openai.Defaults:
        loaded = service.loaded
        if loaded is None:
            raise openai.ApiError(503, f"no model is loaded yet ({service.state}: {service.message or 'starting'})",
                               "server_error", code="model_not_loaded")
        names = (loaded.target, *(a for a in model_aliases if a and a != loaded.target))
        chosen = strategy if strategy in loaded.strategies else (
            "none" if "none" in loaded.strategies else loaded.strategies[0])  # "server" when relaying a server
        return openai.Defaults(names, loaded.strategies, chosen, k, loaded.context_window, sampling())

    def sampling() -> tuple[tuple[str, float], ...]:
        """The loaded model's own sampling defaults (a local model's generation_config; none for a relayed
        server, which applies its own)."""
        runner = service.runner
        target = runner.session.target if runner.backend is runner.session else None
        model = getattr(target, "model", None)
        return openai.model_sampling(getattr(model, "generation_config", None))

    # ---- OpenAI ------------------------------------------------------------------------------------

    def _model_json() -> list[dict]:
        loaded = service.loaded
        return [] if loaded is None else [{
            "id": loaded.target, "object": "model", "created": int(service.started_at), "owned_by": "specula",
            "max_model_len": loaded.context_window,
        }]

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": _model_json()})

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        listed = _model_json()
        names = (*(m["id"] for m in listed), *(a for a in model_aliases if a and listed))
        if name not in names:
            return _error(openai.ApiError(404, f"the model {openai.Quoted(name)!r} does not exist here"
                                          + (f"; this server serves {listed[0]['id']!r}" if listed else ""),
                                          param="model", code="model_not_found"))
        return JSONResponse(listed[0])

    async def chat(request: Request) -> Response:
        return await _generate(request, openai.parse_chat)

    async def completions(request: Request) -> Response:
        return await _generate(request, openai.parse_completion)

    async def _generate(request: Request, parse: Callable) -> Response:
        try:
            body = await _body(request)
            while service.state == "loading":  # a request that comes during a load waits for the model
                if await request.is_disconnected():
                    return Response(status_code=499)
                await asyncio.sleep(0.05)
            parsed = parse(body, defaults())
        except openai.ApiError as exc:
            return _error(exc)
        if service.queue_depth >= max_queue:
            wait = service.expected_wait_s()
            return JSONResponse(openai.ApiError(429, f"the server is busy: {service.queue_depth} requests are waiting "
                                                f"(at most {max_queue}); try again in about {wait} s",
                                                "rate_limit_error", code="queue_full").body(),
                                status_code=429, headers={"Retry-After": str(wait)})
        rid, queue = service.submit(parsed.request)
        early: list = []  # events before Started (a relayed server's counters), sent after it
        # a client that leaves, while its request waits or runs, cancels it before the engine's next step
        gone = _watch_disconnect(request, lambda: service.cancel(rid))
        try:
            first = await queue.get()
            while not isinstance(first, (Started, Failed, Finished)):
                early.append(first)
                first = await queue.get()
        except asyncio.CancelledError:
            gone.cancel()
            service.release(rid)
            raise
        if isinstance(first, Failed):
            gone.cancel()
            service.release(rid)
            return _error(openai.failure(first.kind, first.message))
        if isinstance(first, Finished):  # cancelled while it waited in the queue
            early.append(first)
            first = Started(rid, parsed.request.strategy, 0, parsed.request.config.k)
        headers = {"X-Specula-Request-Id": str(rid)}
        if parsed.stream:
            gone.cancel()  # the streaming response watches for the client leaving itself
            return StreamingResponse(_stream(parsed, rid, queue, first, early), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        try:
            return JSONResponse(await _whole(parsed, rid, queue, first, early), headers=headers)
        except openai.ApiError as exc:
            return _error(exc)
        finally:
            gone.cancel()
            service.release(rid)

    async def _stream(parsed: openai.Parsed, rid: int, queue: asyncio.Queue, started: Started,
                      early: list) -> AsyncIterator[str]:
        answer = openai.Answer(parsed, started, lambda: service.stop_sequence(rid))
        try:
            yield _sse(openai.chunk(parsed, "", role=True, extension=wire.started_json(started)))
            while True:
                event = early.pop(0) if early else await queue.get()
                match event:
                    case Step():
                        released = answer.step(event)
                        if released is not None:
                            piece, tokens = released
                            yield _sse(openai.chunk(parsed, piece, extension=wire.step_json(event, tokens)))
                    case ServerStats():
                        stats = {"server_stats": wire.stats_json(event)}
                        yield _sse(openai.chunk(parsed, None, choices=False, extension=stats))
                    case PromptProgress():
                        progress = {"prompt_progress": wire.progress_json(event)}
                        yield _sse(openai.chunk(parsed, None, choices=False, extension=progress))
                    case Finished():
                        piece, tokens, reason, usage = answer.finish(event)
                        extension = wire.finished_json(event, tokens)
                        yield _sse(openai.chunk(parsed, piece, reason, extension=extension))
                        if parsed.include_usage:  # OpenAI's: one more chunk, without choices
                            yield _sse(openai.chunk(parsed, None, usage=usage, choices=False))
                        yield _sse("[DONE]")
                        return
                    case Failed():
                        yield _sse(openai.failure(event.kind, event.message).body())
                        yield _sse("[DONE]")
                        return
        finally:
            service.release(rid)  # a client that went away cancels its request before the next step

    async def _whole(parsed: openai.Parsed, rid: int, queue: asyncio.Queue, started: Started, early: list) -> dict:
        answer = openai.Answer(parsed, started, lambda: service.stop_sequence(rid))
        tokens: list = []
        while True:
            event = early.pop(0) if early else await queue.get()
            match event:
                case Step():
                    tokens += (answer.step(event) or ("", []))[1]
                case Finished():
                    _, last, reason, usage = answer.finish(event)
                    extension = {**wire.started_json(started), **wire.finished_json(event, tokens + last)}
                    return openai.response(parsed, answer.text.text, reason, usage, extension)
                case Failed():
                    raise openai.failure(event.kind, event.message)

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(prometheus.render(service), media_type="text/plain; version=0.0.4")

    async def health(request: Request) -> Response:
        ready = service.state == "ready"
        path = service.loaded.path if service.loaded is not None else ""
        step = _step()
        return JSONResponse({"status": service.state, "message": service.message, **({"path": path} if path else {}),
                             **({"step": step} if step is not None else {})},
                            status_code=200 if ready else 503)

    def _step() -> str | None:
        """Which decoding step answers (the eager and the compiled one round differently, so a greedy answer's text
        may differ between them: docs/ENGINE.md, "Which step answers"); None for a remote backend or no model."""
        target = service.runner.session.target
        local = service.runner.backend is service.runner.session and target is not None
        return target.step_status if local and service.loaded is not None else None

    # ---- control -----------------------------------------------------------------------------------

    def _loaded_json(loaded: Loaded | None) -> dict | None:
        return None if loaded is None else wire.loaded_json(loaded)

    async def status(request: Request) -> Response:
        return JSONResponse({"state": service.state, "message": service.message, "model": _loaded_json(service.loaded),
                             "default_strategy": strategy, "running": service.running,
                             "queue_depth": service.queue_depth,
                             "step": _step()})

    async def strategies(request: Request) -> Response:
        usable = service.loaded.strategies if service.loaded is not None else ()
        rows = []
        for name, card in STRATEGIES.items():
            rows.append({"name": name, "description": card.description, "available": name in usable,
                         "needs": card.needs, "default_k": card.default_k})
        return JSONResponse({"model": service.loaded.target if service.loaded else None, "strategies": rows})

    async def _progress(request: Request, rid: int, queue: asyncio.Queue) -> AsyncIterator[str]:
        """Load and train progress as server-sent events, until the request's Loaded or Failed; the first
        names the request (for the cancel endpoint)."""
        try:
            yield _sse({"type": "queued", "request_id": rid})
            while True:
                event = await queue.get()
                if isinstance(event, (Loading, Training)):
                    yield _sse({"type": "progress", "message": event.message})
                elif isinstance(event, Trained):
                    yield _sse({"type": "trained", "kind": event.kind, "folder": event.folder,
                                "accepted": event.accepted, "summary": event.summary})
                elif isinstance(event, Loaded):
                    yield _sse({"type": "loaded", "model": _loaded_json(event)})
                    yield _sse("[DONE]")
                    return
                elif isinstance(event, Failed):
                    yield _sse({"type": "error", **openai.failure(event.kind, event.message).body()})
                    yield _sse("[DONE]")
                    return
        finally:
            service.release(rid)

    def _start(request: Request, engine_request) -> Response:
        """Queue a load or a training; its progress streams as server-sent events."""
        rid, queue = service.submit(engine_request)
        return StreamingResponse(_progress(request, rid, queue), media_type="text/event-stream",
                                 headers={"X-Specula-Request-Id": str(rid)})

    def _may_relay(load: RemoteLoadRequest) -> None:
        """A relayed server and its key come from the operator: a request may name an environment variable
        only among --allow-key-env's, and (without an API key) a server only among --allow-server's."""
        if load.api_key_env and load.api_key_env not in allow_key_envs:
            raise openai.ApiError(403, "'server.api_key_env' names an environment variable of this server, which a "
                                  "request may not read; send the key itself as 'server.api_key', or start the server "
                                  "with --allow-key-env VAR", "permission_error", "server.api_key_env", "not_allowed")
        if api_key is None:
            allowed = {_normal(u) for u in allow_servers}
            for name, url in (("url", load.server), ("baseline_url", load.baseline_server)):
                if url and _normal(url) not in allowed:
                    raise openai.ApiError(403, f"this server has no API key, so it relays only the servers it was "
                                          f"started with (--allow-server URL), not {openai.Quoted(url)!r}",
                                          "permission_error", f"server.{name}", "not_allowed")

    async def load(request: Request) -> Response:
        try:
            load_request = openai.parse_load(await _body(request))
            if isinstance(load_request, RemoteLoadRequest):
                _may_relay(load_request)
            return _start(request, load_request)
        except openai.ApiError as exc:
            return _error(exc)

    async def train(request: Request) -> Response:
        try:
            train_request = openai.parse_train(await _body(request))
        except openai.ApiError as exc:
            return _error(exc)
        if service.loaded is None:
            return _error(openai.ApiError(503, "no model is loaded yet", "server_error", code="model_not_loaded"))
        return _start(request, train_request)

    async def cancel(request: Request) -> Response:
        text = request.path_params["rid"]
        if not (text.isascii() and text.isdigit()) or len(text) > 18:  # 4,000 digits are no request's id
            return _error(openai.ApiError(400, f"a request id is a number ({openai.Quoted(text)!r} is not one)"))
        rid = int(text)
        if not service.cancel(rid):
            return _error(openai.ApiError(404, f"no queued or running request {rid}", code="not_found"))
        return JSONResponse({"id": rid, "cancelled": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        service.start(asyncio.get_running_loop())
        if initial is not None:
            service.submit(initial)
        try:
            yield
        finally:
            service.stop()

    routes = [
        Route("/health", health), Route("/metrics", metrics),
        Route("/v1/models", models), Route("/v1/models/{name:path}", model),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route(f"{CONTROL}/status", status), Route(f"{CONTROL}/strategies", strategies),
        Route(f"{CONTROL}/load", load, methods=["POST"]), Route(f"{CONTROL}/train", train, methods=["POST"]),
        Route(f"{CONTROL}/requests/{{rid}}/cancel", cancel, methods=["POST"]),
    ]
    guard = Middleware(Guard, key=api_key, port=port, max_body=max_body, max_active=max_active)
    return Starlette(routes=routes, middleware=[guard], lifespan=lifespan,
                     exception_handlers={404: _not_found, 405: _not_allowed, SpeculaError: _engine_error})


def _normal(url: str) -> str:
    return url.strip().rstrip("/").removesuffix("/v1").lower()


async def _not_found(request: Request, exc) -> Response:
    return _error(openai.ApiError(404, f"no route {openai.Quoted(request.url.path)}", code="not_found"))


async def _not_allowed(request: Request, exc) -> Response:
    return _error(openai.ApiError(405, f"{openai.Quoted(request.method)} is not allowed on {openai.Quoted(request.url.path)}"))


async def _engine_error(request: Request, exc: SpeculaError) -> Response:
    return _error(openai.failure(type(exc).__name__, str(exc)))
