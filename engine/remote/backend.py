"""The remote backend: chat through an OpenAI-compatible server (vLLM first) with the local engine's
events, so the GUI, `specula generate` and the bench treat both backends alike.

    backend = RemoteBackend()
    loaded = backend.load(RemoteLoadRequest("http://127.0.0.1:8011"))   # -> Loaded (backend="remote")
    for event in backend.generate(GenerateRequest(messages), request_id=7, should_stop=flag):
        ...   # Started, Step (inferred from chunks), ServerStats (vLLM's counters), Finished

The server does the speculating (its own configuration); Specula reads what it can see: the streamed
chunks (one per engine step on vLLM, so their sizes give accepted lengths) and vLLM's server-wide
spec-decode counters, sampled before, a few times a second during, and after a request. A speedup is
only shown against a baseline server without speculation whose plain decoding speed was measured.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from ..api import wire
from ..api.errors import SpeculaError, terminal_safe
from ..api.events import REMOTE, BaselineCost, Finished, Loaded, ServerStats, Started, Step
from ..api.metrics import StepTotals
from ..api.prompts import Message
from ..api.types import DecodeConfig, GenerateRequest, RemoteLoadRequest
from .chunks import ChunkReader, chunk_tokens, drop_stop_token
from .client import EngineClient
from .http import EventStream, RemoteError, Server, get_json, get_text
from .keys import resolve_api_key
from .telemetry import SpecCounters, parse_metrics

POLL_S = 0.25  # counters sampled four times a second while a reply streams
PROBE_PROMPT = "Count from 1 to 200, separated by commas."
PROBE_TOKENS = 64


@dataclass(frozen=True)
class ServerInfo:
    server: Server
    model: str
    models: tuple[str, ...]
    kind: str  # "vllm", "specula" (`specula serve`) or "openai" (any other OpenAI-compatible server)
    version: str = ""
    context_window: int = 0  # 0: the server did not say
    speculates: bool = False  # it exposes spec-decode counters

    @property
    def describe(self) -> str:
        what = {"vllm": f"vLLM {self.version}".strip(), "specula": "Specula server"}.get(self.kind, "OpenAI-compatible server")
        return f"{what} at {self.server.root}"


def server_for(url: str, api_key_env: str = "", verify_tls: bool = True, use_keyring: bool = True,
               allow_http_key: bool = False, api_key: str = "") -> Server:
    server = Server(url, verify_tls=verify_tls)  # checks the URL before a key is looked up
    key = resolve_api_key(server.root, api_key_env, use_keyring, api_key)
    return Server(server.url, key, verify_tls, allow_http_key=allow_http_key)


def probe(server: Server, model: str = "") -> ServerInfo:
    """What the server serves and whether it is vLLM with speculation (the settings' "Test connection")."""
    listing = get_json(server, "/v1/models")
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        raise RemoteError(f"{server.root}/v1/models did not list models: is it an OpenAI-compatible server?")
    ids = tuple(shown(str(e["id"])) for e in entries if isinstance(e, dict) and "id" in e)
    if not ids:
        raise RemoteError(f"the server at {server.root} serves no model")
    chosen = model.strip() or ids[0]
    if chosen not in ids:
        raise RemoteError(f"the server at {server.root} has no model '{chosen}'; it serves: {', '.join(ids)}")
    entry = next(e for e in entries if isinstance(e, dict) and "id" in e and shown(str(e["id"])) == chosen)
    window = entry.get("max_model_len")
    if entry.get("owned_by") == "specula":  # `specula serve`: its stream says every token's origin
        return ServerInfo(server, chosen, ids, "specula", "", window if isinstance(window, int) else 0, True)
    version, counters = _vllm_details(server, chosen)
    return ServerInfo(server, chosen, ids, "vllm" if version else "openai", version,
                      window if isinstance(window, int) else 0, counters is not None)


def shown(text: str) -> str:
    """A name the server gave (a model id, its version) as one line a terminal only displays."""
    return terminal_safe(text).replace("\n", " ").replace("\t", " ")


def _vllm_details(server: Server, model: str) -> tuple[str, SpecCounters | None]:
    """vLLM's version (empty for other servers) and its spec-decode counters (None without speculation)."""
    try:
        version = get_json(server, "/version")
        version = shown(str(version.get("version", "")))[:100] if isinstance(version, dict) else ""
    except RemoteError:
        return "", None
    return version, read_counters(server, model)


def read_counters(server: Server, model: str | None) -> SpecCounters | None:
    try:
        return parse_metrics(get_text(server, "/metrics", timeout=2.0), model)
    except RemoteError:
        return None


def chat_payload(info: ServerInfo, request) -> dict:
    """The /v1/chat/completions body for a GenerateRequest (vLLM extras only where the server is vLLM)."""
    if not request.chat:
        raise SpeculaError("the remote backend speaks chat: drop --no-chat / use --chat")
    params = request.config.params
    payload = {"model": info.model, **wire.request_body(request), "stream_options": {"include_usage": True}}
    if info.kind == "vllm":
        payload["return_token_ids"] = True  # token ids per chunk: exact counts and the bench's identity check
        payload["logprobs"] = True  # each token's bytes: per-token text for the colours
        payload["stream_options"]["continuous_usage_stats"] = True  # the prompt's length in the first chunk
        if params.top_k:
            payload["top_k"] = params.top_k
    return payload


class RemoteBackend:
    """The remote counterpart of serving.session.Session (an api.backend.Backend): load (connect), describe, generate."""

    def __init__(self) -> None:
        self.info: ServerInfo | None = None
        self.baseline: BaselineCost | None = None
        self.baseline_info: ServerInfo | None = None

    def load(self, request: RemoteLoadRequest, progress: Callable[[str], None] | None = None) -> Loaded:
        say = progress or (lambda text: None)
        server = server_for(request.server, request.api_key_env, request.verify_tls, request.use_keyring,
                            request.allow_http_key, request.api_key)  # a URL that is not one fails here, before it is shown
        say(f"connecting to {server.url}")
        info = probe(server, request.model)
        baseline = baseline_info = None
        if request.baseline_server.strip():
            plain = server_for(request.baseline_server, request.api_key_env, request.verify_tls, request.use_keyring,
                               request.allow_http_key, request.api_key)
            say(f"measuring plain decoding on {plain.url}")
            baseline_info = probe(plain, info.model)  # the same model, or the speedup would mean nothing
            baseline = measure_plain(baseline_info)
        self.info, self.baseline, self.baseline_info = info, baseline, baseline_info
        return self.describe()

    def describe(self, request_id: int = 0) -> Loaded:
        info = self._need_info()
        notes = []
        if info.kind == "specula":
            notes.append("A Specula server: its stream gives every token's origin and every step's drafts.")
        elif info.speculates:
            notes.append("Acceptance comes from the server's counters: they are server-wide, so other clients' "
                         "requests count too. Token colours are inferred from the stream's chunks.")
        else:
            notes.append("This server reports no speculative decoding counters: tokens/s only.")
        if self.baseline is None:
            notes.append("No baseline server is set, so no speedup is shown.")
        else:
            notes.append(f"Speedup is against {self.baseline_info.server.root} "
                         f"({1 / self.baseline.a:.1f} tokens/s plain, measured when connecting).")
        # a Specula server names every token's origin and each step's drafts; another server's origins are
        # inferred from its chunks and its acceptance read from its (server-wide) counters
        specula = info.kind == "specula"
        capabilities = replace(REMOTE, exact_colours=specula, acceptance="steps" if specula else "counters")
        return Loaded(request_id, info.model, None, info.describe, "server", info.context_window,
                      ("server",), self.baseline, backend="remote", notes=tuple(notes), capabilities=capabilities)

    def _need_info(self) -> ServerInfo:
        if self.info is None:
            raise SpeculaError("no server is connected yet")
        return self.info

    def generate(self, request, request_id: int = 0, should_stop: Callable[[], bool] = lambda: False) -> Iterator:
        info = self._need_info()
        if info.kind == "specula":
            return _specula_reply(info, request, request_id, should_stop)
        return RemoteReply(info, chat_payload(info, request), request_id, should_stop, self.baseline).events()

    def train(self, *args, **kwargs):
        raise SpeculaError("training a draft head needs a local model: switch the backend to local first")


def _specula_reply(info: ServerInfo, request, request_id: int, should_stop: Callable[[], bool]) -> Iterator:
    """A `specula serve` answer: the engine's own events, read from the stream's extension; the server
    uses its default strategy (the request's is this process's choice of a local one)."""
    client = EngineClient(info.server.url, info.server.api_key, info.server.timeout_s, info.server.allow_http_key)
    call = client.call(replace(request, strategy="server"), request_id)
    stopping = False
    for event in call.events():
        yield event
        if not stopping and should_stop():
            stopping = True
            call.close()


def measure_plain(info: ServerInfo) -> BaselineCost:
    """Plain decoding speed of a server without speculation: the fastest of three timed answers of
    PROBE_TOKENS tokens (the first also warms the server up). Seconds per token, independent of the
    context length (b = 0)."""
    request = GenerateRequest((Message("user", PROBE_PROMPT),), config=DecodeConfig.for_strategy("none", max_new_tokens=PROBE_TOKENS))
    payload = chat_payload(info, request)
    if info.kind == "vllm":
        payload["ignore_eos"] = True
    best = None
    for _ in range(3):
        finished = [e for e in RemoteReply(info, payload, 0, lambda: False, None).events() if isinstance(e, Finished)][0]
        t = finished.totals
        if t.new_tokens > 1 and t.decode_s > 0:
            per_token = t.decode_s / (t.new_tokens - 1)
            best = per_token if best is None else min(best, per_token)
    if best is None:
        raise RemoteError(f"the baseline server at {info.server.root} answered too little to time it")
    return BaselineCost(best, 0.0)


class RemoteReply:
    """One streamed answer turned into engine events."""

    def __init__(self, info: ServerInfo, payload: dict, request_id: int, should_stop: Callable[[], bool],
                 baseline: BaselineCost | None) -> None:
        self.info, self.payload, self.rid = info, payload, request_id
        self.should_stop, self.baseline = should_stop, baseline
        self.reader = ChunkReader()
        self.inferred = info.speculates  # one chunk per engine step: accepted drafts, then the target's token
        self.tokens: list = []
        self.counts = StepTotals()  # the steps seen in the stream; what they drafted from the counters
        self.steps = 0
        self.prompt_tokens = 0
        self.first_s: float | None = None
        self.last_s = 0.0
        self.finish_reason: str | None = None
        self.start_counters: SpecCounters | None = None
        self.delta = SpecCounters()
        self.k = 64  # the longest draft, once the counters tell it

    def events(self) -> Iterator:
        if self.info.speculates:
            self.start_counters = read_counters(self.info.server, self.info.model)
            if self.start_counters is not None and self.start_counters.per_position:
                self.k = len(self.start_counters.per_position)  # the server's longest draft
        self.t0 = time.perf_counter()
        stream = _Pump(self.info.server, self.payload)
        inbox = stream.inbox
        started = False
        next_poll = self.t0 + POLL_S
        cancelled = False
        try:
            while True:
                if self.should_stop():
                    stream.close()
                    cancelled = True
                    break
                try:
                    kind, value = inbox.get(timeout=0.05)
                except queue.Empty:
                    kind, value = "idle", None
                if kind == "error":
                    raise value
                if kind == "end":
                    break
                if kind == "event":
                    chunk = self.reader.read(value)
                    if chunk is not None and not started and (chunk.usage or chunk.content or chunk.ids):
                        started = True
                        self._note_usage(chunk.usage)
                        yield Started(self.rid, "server", self.prompt_tokens, 0)
                    step = self._step(chunk) if chunk is not None else None
                    if step is not None:
                        yield step
                if time.perf_counter() >= next_poll:
                    next_poll = time.perf_counter() + POLL_S
                    stats = self._poll()
                    if stats is not None:
                        yield stats
        finally:
            stream.close()
        self.end_s = time.perf_counter() - self.t0
        if not started:
            yield Started(self.rid, "server", self.prompt_tokens, 0)
        stats = self._settled_poll()
        if stats is not None:
            yield stats
        yield self._finished("cancelled" if cancelled else {"length": "length"}.get(self.finish_reason, "eos"))

    def _note_usage(self, usage: dict | None) -> None:
        if usage and isinstance(usage.get("prompt_tokens"), int):
            self.prompt_tokens = usage["prompt_tokens"]

    def _step(self, chunk) -> Step | None:
        self._note_usage(chunk.usage)
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        size = len(chunk.ids) or len(chunk.texts)  # the stop token counts: the step produced it
        one_step = self.inferred and size <= 1 + self.k
        # a chunk longer than any step merged several (the server's API process fell behind): not coloured
        tokens = drop_stop_token(chunk_tokens(chunk, self.steps, one_step), chunk.finish_reason)
        if not tokens:
            return None
        now = time.perf_counter() - self.t0
        if self.first_s is None:
            self.first_s = now
        context = self.prompt_tokens + len(self.tokens)
        accepted = size - 1 if one_step else 0
        step = Step(self.rid, self.steps, 0, accepted, tokens, (), 0.0, now - self.last_s, context, 0, now,
                    inferred=self.inferred)
        if self.steps > 0:  # the first chunk is the prefill's token
            self.counts.add_inferred(accepted if one_step else None)
        self.steps += 1
        self.last_s = now
        self.tokens.extend(tokens)
        return step

    def _poll(self) -> ServerStats | None:
        if self.start_counters is None:
            return None
        now = read_counters(self.info.server, self.info.model)
        if now is None:  # the server went away; the stream says why
            return None
        self.delta = now - self.start_counters
        return self._stats()

    def _stats(self) -> ServerStats:
        """The counters' change since the request started."""
        d = self.delta
        return ServerStats(self.rid, time.perf_counter() - self.t0, round(d.drafts), round(d.draft_tokens),
                           round(d.accepted), tuple(round(a) for a in d.per_position))

    def _settled_poll(self, tries: int = 8) -> ServerStats | None:
        """The counters once the server has booked the last steps (it does so just after streaming them):
        read until two readings agree, a tenth of a second apart."""
        last = self._poll()
        for _ in range(tries):
            if last is None:
                return None
            time.sleep(0.1)
            now = self._poll()
            if now is not None and (now.drafts, now.accepted) == (last.drafts, last.accepted):
                return now
            last = now
        return last

    def _finished(self, reason: str) -> Finished:
        wall = self.end_s
        prefill = self.first_s if self.first_s is not None else wall
        self.counts.take_counters(self._stats())
        self.counts.set_prefill(prefill)
        totals = self.counts.totals(len(self.tokens), wall)
        speedup = self.baseline.speedup(self.prompt_tokens, totals) if self.baseline is not None else None
        text = "".join(t.text for t in self.tokens)
        ids = tuple(t.id for t in self.tokens if t.id >= 0)
        return Finished(self.rid, reason, text, ids, totals, speedup)


class _Pump:
    """Opens the stream and moves its events into `inbox` on a thread of its own: opening may wait (a
    server may hold its headers back until its first token) and so may each read. `close()` returns at
    once: it shuts an open stream down, or has one that is still opening closed as soon as it opens."""

    def __init__(self, server: Server, payload: dict) -> None:
        self.inbox: queue.Queue = queue.Queue()
        self._stream: EventStream | None = None
        self._closed = False
        self._lock = threading.Lock()
        threading.Thread(target=self._run, args=(server, payload), name="specula-remote-stream", daemon=True).start()

    def _run(self, server: Server, payload: dict) -> None:
        try:
            stream = EventStream(server, "/chat/completions", payload)
            with self._lock:
                self._stream, closed = stream, self._closed
            if closed:
                stream.close()
            else:
                for event in stream:
                    self.inbox.put(("event", event))
            self.inbox.put(("end", None))
        except Exception as exc:  # every failure reaches the consumer as the error it is
            self.inbox.put(("error", exc))

    def close(self) -> None:
        with self._lock:
            self._closed, stream = True, self._stream
        if stream is not None:
            stream.close()

