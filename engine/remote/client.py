"""Specula's own client of `specula serve`: engine requests in, engine events out, over HTTP. Torch-free:
the app's process talks to its engine process only through this.

    client = EngineClient("http://127.0.0.1:8000", api_key)
    call = client.call(GenerateRequest(messages, "eagle"), request_id=7)
    for event in call.events():        # Started, Step..., Finished | Failed, as the engine yields them
        ...
    call.close()                       # from any thread: cancels (before the engine's next step)

Generation streams `/v1/chat/completions` (or `/v1/completions` for a raw prompt) and reads the `specula`
extension of each chunk (`wire.py`): every token's origin is the engine's, not inferred. Loading and
training stream the control endpoints. Every failure becomes a `Failed` event, with the engine's own
kind of error where the server said it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator

from ..api import wire
from ..api.events import Failed, Finished, Loading, Started, Step, Trained, Training
from ..api.metrics import StepTotals
from ..api.types import GenerateRequest, LoadRequest, RemoteLoadRequest, TrainRequest
from .http import EngineError, EventStream, RemoteError, Server, request_text
from .keys import resolve_api_key

CONTROL = "/specula/v1"


def generation_payload(request: GenerateRequest) -> tuple[str, dict]:
    """The path and body for a GenerateRequest (stream, with the extension)."""
    body = {**wire.request_body(request), "top_k": request.config.params.top_k}
    if request.strategy != "server":  # "server": whatever the server uses by default
        body["specula"] = wire.extension_json(request)
    return ("/chat/completions" if request.chat else "/completions"), body


def load_payload(request: LoadRequest | RemoteLoadRequest) -> dict:
    """The body of a load. A relayed server's key is looked up here, in the caller's process (its
    environment variable or the OS keyring), and sent as the key itself: an engine never reads an
    environment variable that a request names (docs/SERVER.md, "Security")."""
    if isinstance(request, RemoteLoadRequest):
        server = {"url": request.server, "model": request.model, "baseline_url": request.baseline_server,
                  "verify_tls": request.verify_tls}
        root = Server(request.server, verify_tls=request.verify_tls).root  # the URL is checked first, as in server_for
        key = resolve_api_key(root, request.api_key_env, request.use_keyring, request.api_key)
        return {"server": {**server, "api_key": key} if key else server}
    spec = request.target
    body = {"model": spec.source, "draft": request.draft, "device": spec.device, "dtype": spec.dtype,
            "weights": spec.weights, "measure_baseline": request.measure_baseline, "draft_head": request.draft_head}
    if request.prepare is not None and request.prepare.strategy != "server":
        body["prepare"] = wire.extension_json(request.prepare)
    if request.keep_target:
        body["keep_target"] = True
    return body


class EngineClient:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0,
                 allow_http_key: bool = False) -> None:
        self.server = Server(url, api_key, timeout_s=timeout_s, allow_http_key=allow_http_key)

    def health(self, timeout: float = 2.0) -> dict | None:
        """The server's state ({"status": ..., "message": ...}); None when it does not answer."""
        try:
            text = request_text(self.server, "GET", self.server.root + "/health", None, timeout)
        except EngineError:
            return None
        except RemoteError as exc:
            return {"status": "starting" if exc.status == 503 else "unreachable", "message": str(exc)}
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            return None

    def call(self, request, request_id: int) -> "Call":
        return Call(self, request, request_id)

    def cancel(self, server_id: int) -> None:
        """Ask the server to cancel one of its requests (best effort)."""
        try:
            request_text(self.server, "POST", f"{self.server.root}{CONTROL}/requests/{server_id}/cancel", {}, 5.0)
        except RemoteError:
            pass  # it ended meanwhile


class Call:
    """One request streamed on the thread that iterates `events()`; `close()` from any thread cancels it."""

    def __init__(self, client: EngineClient, request, request_id: int) -> None:
        self.client, self.request, self.rid = client, request, request_id
        self._lock = threading.Lock()
        self._stream: EventStream | None = None
        self._server_id: int | None = None
        self._closed = False

    def close(self) -> None:
        """Cancel: through the cancel endpoint once the server named the request (its last events still
        arrive), else by closing the connection (the server cancels a request whose client left)."""
        with self._lock:
            self._closed = True
            server_id, stream = self._server_id, self._stream
        if server_id is not None and not isinstance(self.request, (LoadRequest, RemoteLoadRequest)):
            threading.Thread(target=self.client.cancel, args=(server_id,), daemon=True).start()
        elif stream is not None:
            stream.close()

    def _open(self, path: str, payload: dict, root: bool = False) -> EventStream | None:
        stream = EventStream(self.client.server, path, payload, root=root)
        with self._lock:
            self._stream, closed = stream, self._closed
        if closed and self._server_id is None:
            stream.close()
            return None
        return stream

    def _named(self, server_id) -> None:
        with self._lock:
            self._server_id, closed = (int(server_id) if server_id is not None else None), self._closed
        if closed and self._server_id is not None:
            self.client.cancel(self._server_id)

    def events(self) -> Iterator:
        try:
            if isinstance(self.request, GenerateRequest):
                yield from self._generate()
            elif isinstance(self.request, (LoadRequest, RemoteLoadRequest)):
                try:
                    payload = load_payload(self.request)
                except RemoteError as exc:  # the key's variable is not set, the URL is not one
                    yield Failed(self.rid, str(exc), "RemoteError")
                    return
                yield from self._control("/load", payload)
            elif isinstance(self.request, TrainRequest):
                r = self.request
                yield from self._control("/train", {"kind": r.kind, "tokens": r.tokens, "epochs": r.epochs,
                                                    "batch": r.batch})
            else:
                yield Failed(self.rid, f"unknown request type {type(self.request).__name__}", "SpeculaError")
        except EngineError as exc:
            yield Failed(self.rid, str(exc), exc.kind)
        except RemoteError as exc:
            yield Failed(self.rid, f"the engine: {exc}", "EngineUnreachable")

    def _control(self, path: str, payload: dict) -> Iterator:
        stream = self._open(CONTROL + path, payload, root=True)
        if stream is None:
            return
        for data in stream:
            kind = data.get("type")
            if kind == "queued":
                self._named(data.get("request_id"))
            elif kind == "progress":
                make = Training if isinstance(self.request, TrainRequest) else Loading
                yield make(self.rid, str(data.get("message", "")))
            elif kind == "trained":
                yield Trained(self.rid, data["kind"], data["folder"], float(data["accepted"]), data["summary"])
            elif kind == "loaded":
                yield wire.loaded_from(data["model"], self.rid)
                return
        if not stream.closed:
            raise RemoteError("the stream ended without a result")

    def _generate(self) -> Iterator:
        path, payload = generation_payload(self.request)
        t0 = time.perf_counter()
        stream = self._open(path, payload)
        seen = _Seen()
        if stream is not None:
            for data in stream:
                ext = data.get("specula") or {}
                choices = data.get("choices") or []
                if "strategy" in ext and not seen.started:
                    seen.started = True
                    self._named(ext.get("request_id"))
                    yield wire.started_from(ext, self.rid)
                    continue
                if "server_stats" in ext:
                    yield wire.stats_from(ext["server_stats"], self.rid)
                    continue
                if "prompt_progress" in ext:
                    yield wire.progress_from(ext["prompt_progress"], self.rid)
                    continue
                if "step" in ext:
                    step = wire.step_from(ext, self.rid)
                    seen.add(step)
                    yield step
                    continue
                if "totals" in ext and choices:
                    tokens = [wire.token_from(t, seen.last_step) for t in ext.get("tokens", ())]
                    text = seen.text + "".join(t.text for t in tokens)
                    ids = seen.ids + tuple(t.id for t in tokens)
                    yield wire.finished_from(ext, self.rid, text, ids)
                    return
        # closed before the server's last chunk: the request was cancelled
        if not seen.started:
            yield Started(self.rid, self.request.strategy, 0, self.request.config.k)
        yield seen.finished(self.rid, time.perf_counter() - t0)


class _Seen:
    """What a stream said so far, for the Finished event of a stream that was cut short."""

    def __init__(self) -> None:
        self.started = False
        self.stats = StepTotals()
        self.text = ""
        self.ids: tuple[int, ...] = ()
        self.last_step = 0
        self.speedup: tuple[float | None, float | None] = (None, None)  # the last step's live speedup and error

    def add(self, step: Step) -> None:
        self.stats.add(step)
        self.text += "".join(t.text for t in step.tokens)
        self.ids += tuple(t.id for t in step.tokens)
        self.last_step = step.step
        self.speedup = (step.speedup, step.speedup_err)

    def finished(self, rid: int, wall_s: float) -> Finished:
        return Finished(rid, "cancelled", self.text, self.ids, self.stats.totals(len(self.ids), wall_s), *self.speedup)
