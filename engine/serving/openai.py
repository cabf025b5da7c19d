"""OpenAI's request and response shapes, and the `specula` extension, for `specula serve`.

Request bodies become engine `GenerateRequest`s here, checked field by field; anything wrong is an
`ApiError` with OpenAI's error shape and the right HTTP status. Fields OpenAI defines that the engine
cannot honour (n > 1, penalties, tools, logprobs) are refused rather than ignored, so a client never gets
an answer to a question it did not ask. Unknown fields are refused too.

The extension object, in a request: `"specula": {"strategy": "eagle", "k": 6, "adaptive_k": true,
"k_max": 12, "options": {"max_n": 3}}`. In a streamed chunk: the step's tokens with their origin
(draft, correction, bonus, target), the rejected drafts, and the step's draft and verify times.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from ..api.errors import SpeculaError
from ..api.events import Finished, Started, Step, Token
from ..api.paths import WEIGHT_NAMES
from ..api.prompts import Message
from ..api.strategies import STRATEGIES, STRATEGY_OPTIONS, default_k
from ..api.types import DecodeConfig, GenerateRequest, LoadRequest, ModelSpec, RemoteLoadRequest, TrainRequest

MAX_STOPS = 4
EXTENSION_FIELDS = {"strategy", "k", "adaptive_k", "k_max", "options", "token_probs"}
_COMMON = {"model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop",
           "n", "user", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "specula"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools",
                         "tool_choice", "parallel_tool_calls"}
COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ApiError(Exception):
    """An error for the client, in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, kind: str = "SpeculaError") -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.kind = kind  # the engine's kind of error (events.Failed.kind), for Specula's own client

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code},
                "specula": {"kind": self.kind}}


# What a failed engine request becomes: the exception's type name -> (status, error type, code).
_FAILURES = {
    "ContextTooLongError": (400, "invalid_request_error", "context_length_exceeded"),
    "IncompatibleDraftError": (400, "invalid_request_error", None),
    "UnsupportedModelError": (400, "invalid_request_error", None),
    "ModelNotFoundError": (404, "invalid_request_error", "model_not_found"),
    "SpeculaError": (400, "invalid_request_error", None),
    "OutOfMemoryError": (503, "server_error", "out_of_memory"),
}


def failure(kind: str, message: str) -> ApiError:
    status, type_, code = _FAILURES.get(kind, (500, "server_error", None))
    return ApiError(status, message, type_, code=code, kind=kind)


@dataclass(frozen=True)
class Defaults:
    """What a request leaves out, and what it may ask for."""

    model_ids: tuple[str, ...]  # names a request's "model" may use (the first is the one listed)
    strategies: tuple[str, ...]  # what the loaded model can use
    strategy: str = "none"
    k: int | None = None  # None: the strategy's own default
    context_window: int = 0


@dataclass(frozen=True)
class Parsed:
    request: GenerateRequest
    kind: str  # "chat" or "completion"
    model: str
    stream: bool = False
    include_usage: bool = False
    stops: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def response_id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.id


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def _number(body: dict, name: str, default, *, integer: bool = False, low=None, high=None, low_open: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise _bad(f"'{name}' must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if not math.isfinite(value):
        raise _bad(f"'{name}' must be finite, got {value!r}", name)
    if low is not None and (value <= low if low_open else value < low):
        raise _bad(f"'{name}' must be {'>' if low_open else '>='} {low}, got {value!r}", name)
    if high is not None and value > high:
        raise _bad(f"'{name}' must be <= {high}, got {value!r}", name)
    return value


def _flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be true or false, got {value!r}", name)
    return value


def _check_fields(body: object, allowed: set[str], what: str) -> dict:
    if not isinstance(body, dict):
        raise _bad(f"the {what} must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _bad(f"unknown field '{unknown[0]}' in the {what}", unknown[0])
    return body


def _refuse_unsupported(body: dict) -> None:
    """OpenAI fields the engine cannot honour, refused unless they ask for the default."""
    if _number(body, "n", 1, integer=True) != 1:
        raise _bad("'n' must be 1: one answer per request", "n")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0) != 0:
            raise _bad(f"'{name}' is not supported (it would change the model's own distribution)", name)
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported", "logit_bias")
    if body.get("logprobs") not in (None, False, 0):
        raise _bad("'logprobs' is not supported; the 'specula' extension of each chunk carries the tokens", "logprobs")
    if body.get("tools"):
        raise _bad("'tools' are not supported", "tools")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise _bad("only the text 'response_format' is supported", "response_format")
    if body.get("echo") or body.get("suffix") or body.get("best_of") not in (None, 1):
        raise _bad("'echo', 'suffix' and 'best_of' are not supported")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _bad("'user' must be a string", "user")


def _model(body: dict, defaults: Defaults) -> str:
    model = body.get("model")
    if model in (None, ""):
        return defaults.model_ids[0]
    if not isinstance(model, str):
        raise _bad("'model' must be a string", "model")
    if model not in defaults.model_ids:
        raise ApiError(404, f"the model '{model}' does not exist here; this server serves '{defaults.model_ids[0]}'",
                       param="model", code="model_not_found")
    return defaults.model_ids[0]


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("'stop' must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOPS:
        raise _bad(f"'stop' takes at most {MAX_STOPS} sequences", "stop")
    return tuple(s for s in stops if s)


def _extension(body: dict, defaults: Defaults) -> tuple[str, dict, tuple]:
    """The `specula` object -> (strategy, DecodeConfig keyword arguments, strategy options)."""
    ext = _check_fields(body.get("specula") or {}, EXTENSION_FIELDS, "'specula' extension")
    strategy = ext.get("strategy", defaults.strategy)
    if not isinstance(strategy, str) or (strategy not in STRATEGIES and strategy not in defaults.strategies):
        raise _bad(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}", "specula.strategy")
    if strategy not in defaults.strategies:
        raise _bad(f"the loaded model cannot use '{strategy}' (it needs a draft model or a trained head); "
                   f"it can use: {', '.join(defaults.strategies)}", "specula.strategy")
    k_default = defaults.k if defaults.k is not None and strategy == defaults.strategy else default_k(strategy)
    config = {"k": _number(ext, "k", k_default, integer=True, low=1),
              "adaptive_k": _flag(ext, "adaptive_k"), "token_probs": _flag(ext, "token_probs")}
    if "k_max" in ext:
        config["k_max"] = _number(ext, "k_max", None, integer=True, low=1)
    options = _check_fields(ext.get("options") or {}, set(STRATEGY_OPTIONS), "'specula.options' object")
    for name, value in options.items():
        kinds = STRATEGY_OPTIONS[name].kinds
        if not STRATEGY_OPTIONS[name].accepts(value):
            raise _bad(f"'specula.options.{name}' must be {' or '.join(k.__name__ for k in kinds)}, got {value!r}",
                       f"specula.options.{name}")
    return strategy, config, tuple(sorted((n, int(v) if isinstance(v, bool) else v) for n, v in options.items()))


def _request(body: dict, defaults: Defaults, messages: tuple[Message, ...], chat: bool, max_name: str) -> GenerateRequest:
    strategy, config, options = _extension(body, defaults)
    limit = defaults.context_window or 1 << 30
    max_tokens = _number(body, max_name, limit, integer=True, low=1)
    sampling = {"temperature": _number(body, "temperature", 1.0, low=0, high=2),
                "top_p": _number(body, "top_p", 1.0, low=0, high=1, low_open=True),
                "top_k": _number(body, "top_k", 0, integer=True, low=0)}
    seed = _number(body, "seed", None, integer=True)
    try:
        decode = DecodeConfig.for_strategy(strategy, max_new_tokens=max_tokens, seed=seed, **sampling, **config)
    except SpeculaError as exc:
        raise _bad(str(exc), "specula") from None
    return GenerateRequest(messages, strategy, decode, chat=chat, options=options)


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise _bad("'stream_options' takes only 'include_usage'", "stream_options")
    return stream, _flag(options, "include_usage")


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"messages[{index}]: only text content parts are supported", f"messages[{index}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"messages[{index}] needs a 'content' string", f"messages[{index}].content")


def parse_chat(body: object, defaults: Defaults) -> Parsed:
    body = _check_fields(body, CHAT_FIELDS, "request")
    _refuse_unsupported(body)
    if body.get("top_logprobs") is not None:
        raise _bad("'top_logprobs' is not supported", "top_logprobs")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty list", "messages")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            raise _bad(f"messages[{i}] must be an object", f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise _bad(f"messages[{i}] has role {role!r}: use system, user or assistant", f"messages[{i}].role")
        messages.append(Message(ROLES[role], _content(message, i)))
    max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    stream, usage = _stream_flags(body)
    return Parsed(_request(body, defaults, tuple(messages), True, max_name), "chat", _model(body, defaults),
                  stream, usage, _stops(body))


def parse_completion(body: object, defaults: Defaults) -> Parsed:
    body = _check_fields(body, COMPLETION_FIELDS, "request")
    _refuse_unsupported(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise _bad("'prompt' must be a non-empty string (one prompt per request)", "prompt")
    stream, usage = _stream_flags(body)
    return Parsed(_request(body, defaults, (Message("user", prompt),), False, "max_tokens"), "completion",
                  _model(body, defaults), stream, usage, _stops(body))


# ---- responses ---------------------------------------------------------------------------------------


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(finished: Finished, stopped: bool) -> str:
    if stopped:
        return "stop"
    return {"eos": "stop", "length": "length"}.get(finished.reason, finished.reason)


def chunk(parsed: Parsed, text: str | None, finish: str | None = None, *, role: bool = False,
          extension: dict | None = None, usage: dict | None = None, choices: bool = True) -> dict:
    """One streamed chunk: chat.completion.chunk or text_completion."""
    if parsed.kind == "chat":
        delta = {"role": "assistant", "content": text or ""} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out = {"id": parsed.response_id, "object": obj, "created": parsed.created, "model": parsed.model,
           "choices": [choice] if choices else []}
    if usage is not None:
        out["usage"] = usage
    if extension is not None:
        out["specula"] = extension
    return out


def response(parsed: Parsed, text: str, finish: str, usage: dict, extension: dict) -> dict:
    """The whole answer at once (stream false)."""
    if parsed.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": parsed.response_id, "object": obj, "created": parsed.created, "model": parsed.model,
            "choices": [choice], "usage": usage, "specula": extension}


class TextStream:
    """The answer's text as it may be sent: cut at the first stop sequence, and holding back the end of
    the text that could still begin one. Tokens are released with the text that ends them (a token cut
    by a stop sequence keeps only its part before it)."""

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.text = ""
        self.sent = 0
        self.stopped = False
        self._pending: list[tuple[Token, int, int]] = []  # (token, start, end) in self.text

    def push(self, tokens: tuple[Token, ...]) -> tuple[str, list[Token]]:
        if self.stopped:
            return "", []
        searched = max(0, len(self.text) - self.hold)
        for token in tokens:
            start = len(self.text)
            self.text += token.text
            self._pending.append((token, start, len(self.text)))
        hits = [i for i in (self.text.find(s, searched) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[: min(hits)]
            return self._release(len(self.text))
        return self._release(len(self.text) - self.hold)

    def finish(self, final_text: str) -> tuple[str, list[Token]]:
        """Everything still held; `final_text` (the engine's whole answer) adds what the last tokens'
        text did not yet say (an incomplete character at the end)."""
        if not self.stopped and final_text.startswith(self.text):
            self.text = final_text
        return self._release(len(self.text))

    def _release(self, upto: int) -> tuple[str, list[Token]]:
        upto = max(self.sent, min(upto, len(self.text)))
        piece = self.text[self.sent : upto]
        self.sent = upto
        out, keep = [], []
        for token, start, end in self._pending:
            if end <= upto:
                out.append(token)
            elif self.stopped and start < upto:
                out.append(Token(token.id, token.text[: upto - start], token.origin, token.step, token.draft_pos,
                                 token.p, token.q, token.branch))
            elif not self.stopped:
                keep.append((token, start, end))
        self._pending = keep
        return piece, out


class Answer:
    """One answer as the client receives it, streamed or whole: the text cut at a stop sequence (the
    engine is told to stop, `on_stop`), each step's tokens released with their text, and the usage
    counting only what was sent when a stop sequence cut the answer."""

    def __init__(self, parsed: Parsed, started: Started, on_stop) -> None:
        self.parsed, self.started, self.on_stop = parsed, started, on_stop
        self.text = TextStream(parsed.stops)
        self.sent_tokens = 0

    def step(self, event: Step) -> tuple[str, list[Token]] | None:
        """The text and tokens a step releases; None for the steps that ran while a stop took effect."""
        if self.text.stopped:
            return None
        piece, tokens = self.text.push(event.tokens)
        self.sent_tokens += len(tokens)
        if self.text.stopped:
            self.on_stop()
        return piece, tokens

    def finish(self, event: Finished) -> tuple[str, list[Token], str, dict]:
        """What is still held, the finish reason and the usage."""
        piece, tokens = self.text.finish(event.text)
        self.sent_tokens += len(tokens)
        count = self.sent_tokens if self.text.stopped else event.totals.new_tokens
        return piece, tokens, finish_reason(event, self.text.stopped), usage_json(self.started.prompt_tokens, count)


# ---- the control endpoints' bodies ---------------------------------------------------------------------

LOAD_FIELDS = {"model", "draft", "device", "dtype", "weights", "measure_baseline", "server"}
SERVER_FIELDS = {"url": str, "model": str, "api_key_env": str, "baseline_url": str, "verify_tls": bool}
TRAIN_KINDS = ("eagle", "medusa")


def parse_load(body: object) -> LoadRequest | RemoteLoadRequest:
    """POST /specula/v1/load: a model to load here, or (with "server") a server to relay."""
    body = _check_fields(body, LOAD_FIELDS, "request")
    if body.get("server") is not None:
        return _parse_server(body["server"])
    source = body.get("model")
    if not isinstance(source, str) or not source.strip():
        raise _bad("'model' must name a model: bundled, a folder, a .gguf file or a Hub id", "model")
    texts = {name: body.get(name, "auto") for name in ("device", "dtype", "weights")}
    if not all(isinstance(v, str) for v in texts.values()) or texts["weights"] not in WEIGHT_NAMES:
        raise _bad(f"'device', 'dtype' and 'weights' must be strings (weights: {', '.join(WEIGHT_NAMES)})")
    draft = body.get("draft")
    if draft is not None and not isinstance(draft, str):
        raise _bad("'draft' must be a model source", "draft")
    measure = _flag(body, "measure_baseline", True)
    spec = ModelSpec(source.strip(), texts["device"], texts["dtype"], texts["weights"])
    return LoadRequest(spec, draft or None, measure_baseline=measure)


def _parse_server(server: object) -> RemoteLoadRequest:
    """Chat through another OpenAI-compatible server (vLLM), the engine relaying its answers."""
    server = _check_fields(server, set(SERVER_FIELDS), "'server' object")
    for name, kind in SERVER_FIELDS.items():
        if name in server and type(server[name]) is not kind:
            raise _bad(f"'server.{name}' must be {kind.__name__}", f"server.{name}")
    if not server.get("url"):
        raise _bad("'server.url' is required", "server.url")
    return RemoteLoadRequest(server["url"], server.get("model", ""), server.get("api_key_env", ""),
                             server.get("baseline_url", ""), server.get("verify_tls", True))


def parse_train(body: object) -> TrainRequest:
    """POST /specula/v1/train: which head to train, and how long."""
    body = _check_fields(body, {"kind", "tokens", "epochs", "batch"}, "request")
    kind = body.get("kind", "eagle")
    if kind not in TRAIN_KINDS:
        raise _bad(f"'kind' must be {' or '.join(TRAIN_KINDS)}", "kind")
    numbers = {n: _number(body, n, getattr(TrainRequest, n), integer=True, low=1) for n in ("tokens", "epochs", "batch")}
    return TrainRequest(kind, **numbers)

