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

The handlers are the methods of `Routes`, over the EngineService that loads, queues, runs and counts (and says
which sampling defaults and which decoding step the loaded model has); `create_app` puts them behind the guard.
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
from dataclasses import dataclass
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
from ..api.types import LoadRequest, RemoteLoadRequest, TrainRequest
from . import control, faults, openai, prometheus, replies
from .guard import MAX_ACTIVE, MAX_BODY_BYTES, Guard
from .service import EngineService

log = logging.getLogger(__name__)
CONTROL = "/specula/v1"
MAX_QUEUE = 16  # generation requests waiting behind the running one; more are refused with 429


def _error(exc: faults.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _sse(obj: dict | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def _body(request: Request) -> object:
    try:
        body = await request.json()
    except RecursionError:
        raise faults.ApiError(400, "the request body nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and an integer past Python's digit limit
        if "digits" in str(exc) and not isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
            raise faults.ApiError(400, f"a number in the request body has more than {sys.get_int_max_str_digits():,} "
                                       "digits") from None
        raise faults.ApiError(400, "the request body is not valid JSON") from None
    found = _lone_surrogate(body)
    if found is not None:
        where, key = str(faults.Quoted(found[0])), found[1]
        what = f"the key '{where}'" if key else (f"'{where}'" if where else "the body")
        raise faults.ApiError(400, f"{what} holds a lone UTF-16 surrogate (an escape such as \\ud800 that is half of "
                                   "a character): it is not text", param=where or None)
    return body


_SURROGATE = re.compile("[\ud800-\udfff]")


def _lone_surrogate(value: object, path: str = "") -> tuple[str, bool] | None:
    """The path (e.g. messages[0].content) of the first key or string in a parsed body that holds a lone
    surrogate (JSON's \\ud800 escapes decode to one where no pair follows), and whether it is a key (its path
    ends with the key, its surrogates written as escapes: messages[0].\\udfff), else None. Such a string cannot
    be encoded, tokenized or echoed in an error message as it is."""
    if isinstance(value, str):
        return (path, False) if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if _SURROGATE.search(key):
                escaped = key.encode("utf-8", "backslashreplace").decode("utf-8")
                return (f"{path}.{escaped}" if path else escaped), True
            found = _lone_surrogate(item, f"{path}.{key}" if path else str(key))
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


async def _opening(queue: asyncio.Queue) -> tuple[Started | Failed | Finished, list]:
    """A generation's first event that says how it goes (Started, Failed, or Finished where it was cancelled while
    it waited), and the events that came before it (a relayed server's counters), to be sent after it."""
    early: list = []
    first = await queue.get()
    while not isinstance(first, (Started, Failed, Finished)):
        early.append(first)
        first = await queue.get()
    return first, early


@dataclass(frozen=True)
class Routes:
    """The routes' handlers over one EngineService (which loads, queues, runs and counts); `table()` maps
    the paths to them. `model_aliases`: more names a request's "model" may use. `strategy` and `k`: what a
    request that names none gets. `initial`: loaded when the server starts (requests queue behind it).
    `keyed`: whether the server has an API key (its holders may relay any server). `max_queue`: generations
    that may wait behind the running one (more are refused with 429). `allow_servers`: servers any caller
    may relay. `allow_key_envs`: environment variables a load request may name as a relayed server's key
    (none by default)."""

    service: EngineService
    model_aliases: tuple[str, ...] = ()
    strategy: str = "auto"
    k: int | None = None
    initial: LoadRequest | None = None
    keyed: bool = False
    max_queue: int = MAX_QUEUE
    allow_servers: tuple[str, ...] = ()
    allow_key_envs: tuple[str, ...] = ()

    def table(self) -> list[Route]:
        return [
            Route("/health", self.health), Route("/metrics", self.metrics),
            Route("/v1/models", self.models), Route("/v1/models/{name:path}", self.model),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route(f"{CONTROL}/status", self.status), Route(f"{CONTROL}/strategies", self.strategies),
            Route(f"{CONTROL}/load", self.load, methods=["POST"]),
            Route(f"{CONTROL}/train", self.train, methods=["POST"]),
            Route(f"{CONTROL}/requests/{{rid}}/cancel", self.cancel, methods=["POST"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette):
        self.service.start(asyncio.get_running_loop())
        if self.initial is not None:
            self.service.begin(self.initial)
        try:
            yield
        finally:
            self.service.stop()

    def defaults(self) -> openai.Defaults:
        """What a generation leaves out, and what it may ask for, from the loaded model and the server's settings."""
        loaded = self.service.loaded
        if loaded is None:
            raise faults.ApiError(503, f"no model is loaded yet ({self.service.state}: "
                                  f"{self.service.message or 'starting'})", "server_error", code="model_not_loaded")
        names = (loaded.target, *(a for a in self.model_aliases if a and a != loaded.target))
        chosen = self.strategy if self.strategy in loaded.strategies else (
            "none" if "none" in loaded.strategies else loaded.strategies[0])  # "server" when relaying a server
        return openai.Defaults(names, loaded.strategies, chosen, self.k, loaded.context_window,
                               self.service.sampling_defaults)

    # ---- OpenAI ------------------------------------------------------------------------------------

    def _model_json(self) -> list[dict]:
        loaded = self.service.loaded
        return [] if loaded is None else [{
            "id": loaded.target, "object": "model", "created": int(self.service.started_at), "owned_by": "specula",
            "max_model_len": loaded.context_window,
        }]

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": self._model_json()})

    async def model(self, request: Request) -> Response:
        name = request.path_params["name"]
        listed = self._model_json()
        names = (*(m["id"] for m in listed), *(a for a in self.model_aliases if a and listed))
        if name not in names:
            return _error(faults.ApiError(404, f"the model {faults.Quoted(name)!r} does not exist here"
                                          + (f"; this server serves {listed[0]['id']!r}" if listed else ""),
                                          param="model", code="model_not_found"))
        return JSONResponse(listed[0])

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, openai.parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, openai.parse_completion)

    async def _parse(self, request: Request, parse: Callable) -> openai.Parsed | None:
        """The body as a generation; a request that comes during a load waits for the model (None: the
        client left meanwhile)."""
        body = await _body(request)
        while self.service.state == "loading":
            if await request.is_disconnected():
                return None
            await asyncio.sleep(0.05)
        return parse(body, self.defaults())

    def _queue_full(self) -> Response:
        wait = self.service.expected_wait_s()
        error = faults.ApiError(429, f"the server is busy: {self.service.queue_depth} requests are waiting "
                                f"(at most {self.max_queue}); try again in about {wait} s", "rate_limit_error",
                                code="queue_full")
        return JSONResponse(error.body(), status_code=429, headers={"Retry-After": str(wait)})

    async def _generate(self, request: Request, parse: Callable) -> Response:
        try:
            parsed = await self._parse(request, parse)
        except faults.ApiError as exc:
            return _error(exc)
        if parsed is None:
            return Response(status_code=499)
        if self.service.queue_depth >= self.max_queue:
            return self._queue_full()
        rid, queue = self.service.begin(parsed.request)
        # a client that leaves, while its request waits or runs, cancels it before the engine's next step
        gone = _watch_disconnect(request, lambda: self.service.cancel(rid))
        try:
            first, early = await _opening(queue)
        except asyncio.CancelledError:
            gone.cancel()
            self.service.release(rid)
            raise
        if isinstance(first, Failed):
            gone.cancel()
            self.service.release(rid)
            return _error(faults.failure(first.kind, first.message))
        if isinstance(first, Finished):  # cancelled while it waited in the queue
            early.append(first)
            first = Started(rid, parsed.request.strategy, 0, parsed.request.config.k)
        return await self._answer(parsed, rid, queue, first, early, gone)

    async def _answer(self, parsed: openai.Parsed, rid: int, queue: asyncio.Queue, started: Started, early: list,
                      gone: asyncio.Task) -> Response:
        """A started generation's answer: streamed, or whole once it finished. `gone` watches for the client
        leaving until the answer is sent."""
        headers = {"X-Specula-Request-Id": str(rid)}
        if parsed.stream:
            gone.cancel()  # the streaming response watches for the client leaving itself
            return StreamingResponse(self._stream(parsed, rid, queue, started, early), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        try:
            return JSONResponse(await self._whole(parsed, rid, queue, started, early), headers=headers)
        except faults.ApiError as exc:
            return _error(exc)
        finally:
            gone.cancel()
            self.service.release(rid)

    async def _stream(self, parsed: openai.Parsed, rid: int, queue: asyncio.Queue, started: Started,
                      early: list) -> AsyncIterator[str]:
        answer = replies.Answer(parsed, started, lambda: self.service.stop_sequence(rid))
        try:
            yield _sse(replies.chunk(parsed, "", role=True, extension=wire.started_json(started)))
            while True:
                event = early.pop(0) if early else await queue.get()
                match event:
                    case Step():
                        released = answer.step(event)
                        if released is not None:
                            piece, tokens = released
                            yield _sse(replies.chunk(parsed, piece, extension=wire.step_json(event, tokens)))
                    case ServerStats():
                        stats = {"server_stats": wire.stats_json(event)}
                        yield _sse(replies.chunk(parsed, None, choices=False, extension=stats))
                    case PromptProgress():
                        progress = {"prompt_progress": wire.progress_json(event)}
                        yield _sse(replies.chunk(parsed, None, choices=False, extension=progress))
                    case Finished():
                        piece, tokens, reason, usage = answer.finish(event)
                        extension = wire.finished_json(answer.ended(event), tokens)
                        yield _sse(replies.chunk(parsed, piece, reason, extension=extension))
                        if parsed.include_usage:  # OpenAI's: one more chunk, without choices
                            yield _sse(replies.chunk(parsed, None, usage=usage, choices=False))
                        yield _sse("[DONE]")
                        return
                    case Failed():
                        yield _sse(faults.failure(event.kind, event.message).body())
                        yield _sse("[DONE]")
                        return
        finally:
            self.service.release(rid)  # a client that went away cancels its request before the next step

    async def _whole(self, parsed: openai.Parsed, rid: int, queue: asyncio.Queue, started: Started,
                     early: list) -> dict:
        answer = replies.Answer(parsed, started, lambda: self.service.stop_sequence(rid))
        tokens: list = []
        while True:
            event = early.pop(0) if early else await queue.get()
            match event:
                case Step():
                    tokens += (answer.step(event) or ("", []))[1]
                case Finished():
                    _, last, reason, usage = answer.finish(event)
                    ended = wire.finished_json(answer.ended(event), tokens + last)
                    extension = {**wire.started_json(started), **ended}
                    return replies.response(parsed, answer.text.text, reason, usage, extension)
                case Failed():
                    raise faults.failure(event.kind, event.message)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(prometheus.render(self.service), media_type="text/plain; version=0.0.4")

    async def health(self, request: Request) -> Response:
        service = self.service
        path = service.loaded.path if service.loaded is not None else ""
        step = service.step_status
        return JSONResponse({"status": service.state, "message": service.message, **({"path": path} if path else {}),
                             **({"step": step} if step is not None else {})},
                            status_code=200 if service.state == "ready" else 503)

    # ---- control -----------------------------------------------------------------------------------

    async def status(self, request: Request) -> Response:
        service = self.service
        return JSONResponse({"state": service.state, "message": service.message, "model": _loaded_json(service.loaded),
                             "default_strategy": self.strategy, "running": service.running,
                             "queue_depth": service.queue_depth, "step": service.step_status})

    async def strategies(self, request: Request) -> Response:
        loaded = self.service.loaded
        usable = loaded.strategies if loaded is not None else ()
        rows = [{"name": name, "description": card.description, "available": name in usable, "needs": card.needs,
                 "default_k": card.default_k} for name, card in STRATEGIES.items()]
        return JSONResponse({"model": loaded.target if loaded else None, "strategies": rows})

    async def _progress(self, rid: int, queue: asyncio.Queue) -> AsyncIterator[str]:
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
                    yield _sse({"type": "error", **faults.failure(event.kind, event.message).body()})
                    yield _sse("[DONE]")
                    return
        finally:
            self.service.release(rid)

    def _start(self, engine_request: LoadRequest | RemoteLoadRequest | TrainRequest) -> Response:
        """Queue a load or a training; its progress streams as server-sent events."""
        rid, queue = self.service.begin(engine_request)
        return StreamingResponse(self._progress(rid, queue), media_type="text/event-stream",
                                 headers={"X-Specula-Request-Id": str(rid)})

    def _may_relay(self, load: RemoteLoadRequest) -> None:
        """A relayed server and its key come from the operator: a request may name an environment variable
        only among --allow-key-env's, and (without an API key) a server only among --allow-server's."""
        if load.api_key_env and load.api_key_env not in self.allow_key_envs:
            raise faults.ApiError(403, "'server.api_key_env' names an environment variable of this server, which a "
                                  "request may not read; send the key itself as 'server.api_key', or start the server "
                                  "with --allow-key-env VAR", "permission_error", "server.api_key_env", "not_allowed")
        if not self.keyed:
            allowed = {_normal(u) for u in self.allow_servers}
            for name, url in (("url", load.server), ("baseline_url", load.baseline_server)):
                if url and _normal(url) not in allowed:
                    raise faults.ApiError(403, f"this server has no API key, so it relays only the servers it was "
                                          f"started with (--allow-server URL), not {faults.Quoted(url)!r}",
                                          "permission_error", f"server.{name}", "not_allowed")

    async def load(self, request: Request) -> Response:
        try:
            load_request = control.parse_load(await _body(request))
            if isinstance(load_request, RemoteLoadRequest):
                self._may_relay(load_request)
            else:  # a model that is not there is a 4xx of its own, not an error event in a stream under 200
                await asyncio.to_thread(control.check_sources, load_request)
            return self._start(load_request)
        except faults.ApiError as exc:
            return _error(exc)

    async def train(self, request: Request) -> Response:
        try:
            train_request = control.parse_train(await _body(request))
        except faults.ApiError as exc:
            return _error(exc)
        if self.service.loaded is None:
            return _error(faults.ApiError(503, "no model is loaded yet", "server_error", code="model_not_loaded"))
        return self._start(train_request)

    async def cancel(self, request: Request) -> Response:
        text = request.path_params["rid"]
        if not (text.isascii() and text.isdigit()) or len(text) > 18:  # 4,000 digits are no request's id
            return _error(faults.ApiError(400, f"a request id is a number ({faults.Quoted(text)!r} is not one)"))
        rid = int(text)
        if not self.service.cancel(rid):
            return _error(faults.ApiError(404, f"no queued or running request {rid}", code="not_found"))
        return JSONResponse({"id": rid, "cancelled": True})


def create_app(service: EngineService, *, model_aliases: tuple[str, ...] = (), strategy: str = "auto",
               k: int | None = None, api_key: str | None = None, initial: LoadRequest | None = None,
               port: int | None = None, max_body: int = MAX_BODY_BYTES, max_queue: int = MAX_QUEUE,
               allow_servers: tuple[str, ...] = (), allow_key_envs: tuple[str, ...] = (),
               max_active: int = MAX_ACTIVE) -> Starlette:
    """The ASGI app: Routes over `service` behind the guard. `port`: the port it listens on (a keyless
    server answers only Host loopback:port); the other settings are Routes' and the Guard's."""
    routes = Routes(service, model_aliases=model_aliases, strategy=strategy, k=k, initial=initial,
                    keyed=api_key is not None, max_queue=max_queue, allow_servers=allow_servers,
                    allow_key_envs=allow_key_envs)
    guard = Middleware(Guard, key=api_key, port=port, max_body=max_body, max_active=max_active)
    return Starlette(routes=routes.table(), middleware=[guard], lifespan=routes.lifespan,
                     exception_handlers={404: _not_found, 405: _not_allowed, SpeculaError: _engine_error})


def _loaded_json(loaded: Loaded | None) -> dict | None:
    return None if loaded is None else wire.loaded_json(loaded)


def _normal(url: str) -> str:
    return url.strip().rstrip("/").removesuffix("/v1").lower()


async def _not_found(request: Request, exc) -> Response:
    return _error(faults.ApiError(404, f"no route {faults.Quoted(request.url.path)}", code="not_found"))


async def _not_allowed(request: Request, exc) -> Response:
    method, path = faults.Quoted(request.method), faults.Quoted(request.url.path)
    return _error(faults.ApiError(405, f"{method} is not allowed on {path}"))


async def _engine_error(request: Request, exc: SpeculaError) -> Response:
    return _error(faults.failure(type(exc).__name__, str(exc)))
