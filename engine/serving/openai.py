"""OpenAI's request and response shapes, and the `specula` extension, for `specula serve`.

Request bodies are pydantic models here, as vLLM's protocol module has them (ChatCompletionRequest,
CompletionRequest), with the `specula` extension and the control endpoints' bodies beside them; a validated
body becomes an engine `GenerateRequest`. JSON types are taken exactly (1 is not true, 2.0 is not an
integer); anything wrong is an `ApiError` with OpenAI's error shape, the right HTTP status and a one-line
message. Fields OpenAI defines that the engine cannot honour (n > 1, penalties, tools, logprobs) are
refused rather than ignored, so a client never gets an answer to a question it did not ask. Unknown fields
are refused too.

The extension object, in a request: `"specula": {"strategy": "eagle", "k": 6, "adaptive_k": true,
"k_max": 12, "options": {"max_n": 3}}`. In a streamed chunk: the step's tokens with their origin
(draft, correction, bonus, target), the rejected drafts, and the step's draft and verify times.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    create_model,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..api.errors import SpeculaError
from ..api.events import Finished, Started, Step, Token
from ..api.paths import WEIGHT_NAMES
from ..api.prompts import Message
from ..api.strategies import STRATEGIES, STRATEGY_OPTIONS, StrategyOption, default_k
from ..api.types import DecodeConfig, GenerateRequest, LoadRequest, ModelSpec, RemoteLoadRequest, TrainRequest

MAX_STOPS = 4
ECHO_CHARS = 80  # the most of a request's own value an error message repeats
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TRAIN_KINDS = ("eagle", "eagle3", "medusa")


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
    "TrainingCancelled": (409, "cancelled", "cancelled"),  # asked for: not the server's failure
}


def failure(kind: str, message: str) -> ApiError:
    status, type_, code = _FAILURES.get(kind, (500, "server_error", None))
    return ApiError(status, message, type_, code=code, kind=kind)


@dataclass(frozen=True)
class Defaults:
    """What a request leaves out, and what it may ask for."""

    model_ids: tuple[str, ...]  # names a request's "model" may use (the first is the one listed)
    strategies: tuple[str, ...]  # what the loaded model can use
    strategy: str = "none"  # one of `strategies`
    k: int | None = None  # None: the strategy's own default
    context_window: int = 0
    # the sampling a request that leaves it out gets: the model's generation_config.json where it sets
    # temperature, top_p or top_k (as vLLM does), else greedy, as the window answers (model_sampling)
    sampling: tuple[tuple[str, float], ...] = ()


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


# ---- from pydantic's errors to the API's ---------------------------------------------------------------

_WORDED = "specula"  # the type of a pydantic error that already carries the API's wording (_fault)

# pydantic's own faults in the API's words, by the fault's type: (message, param). They may say {name} (the
# field), {input!r} (the value given), {object} (the object at the fault's place), {parent} (the object that
# holds the field) and {ge}, {gt}, {le} (a number's bound): _words. Fields that need other words say so
# themselves (_says, _fault); a fault of a type not listed here is _UNLISTED.
_WORDING: dict[str, tuple[str, str | None]] = {
    "extra_forbidden": ("unknown field '{name}' in the {parent}", "{name}"),
    "model_type": ("the {object} must be a JSON object", None),
    "int_type": ("'{name}' must be an integer, got {input!r}", "{name}"),
    "float_type": ("'{name}' must be a number, got {input!r}", "{name}"),
    "bool_type": ("'{name}' must be true or false, got {input!r}", "{name}"),
    "finite_number": ("'{name}' must be finite, got {input!r}", "{name}"),
    "greater_than_equal": ("'{name}' must be >= {ge}, got {input!r}", "{name}"),
    "greater_than": ("'{name}' must be > {gt}, got {input!r}", "{name}"),
    "less_than_equal": ("'{name}' must be <= {le}, got {input!r}", "{name}"),
}
_UNLISTED = ("'{name}' is not valid, got {input!r}", "{name}")
_OBJECTS = {(): "request", ("specula",): "'specula' extension"}


def _fault(message: str, param: str | None = None, status: int = 400, code: str | None = None,
           **values: object) -> PydanticCustomError:
    """A fault in the API's words. `message` and `param` may say what `_words` gives ({i}, the list index in the
    fault's path, as in messages[{i}]; {input!r}, the value given) and any of `values`; `_api_error` fills them in."""
    return PydanticCustomError(_WORDED, message, {"param": param, "status": status, "code": code, "values": values,
                                                 "message": message})


def _first(errors: list[dict]) -> dict:
    """The fault a body reports: the first in field order, except that unknown fields come before everything
    else in their object (pydantic lists them last), an outer object's before an inner's, and by name."""

    def rank(item: tuple[int, dict]) -> tuple:
        index, error = item
        if error["type"] != "extra_forbidden":
            return index, 1, 0, ""
        parent = error["loc"][:-1]
        start = next(j for j, other in enumerate(errors) if other["loc"][: len(parent)] == parent)
        return start, 0, len(parent), str(error["loc"][-1])

    return min(enumerate(errors), key=rank)[1]


def _bound(value: object) -> str:
    """A bound as a message shows it: an integer whole (a seed's is 18446744073709551615, not 1.84467e+19), a
    number short (0.5, 2)."""
    return str(value) if isinstance(value, int) else format(value, "g")


def _words(error: dict) -> dict[str, object]:
    """What a fault's message and param may say: the field's {name}, the {input} given (cut short), the list index
    {i} in its path (as in messages[{i}]), the {object} at its place and the {parent} that holds it, a number's
    bound ({ge}, {gt}, {le}), and a fault in the API's words its own values (_fault)."""
    loc, ctx = error["loc"], error.get("ctx", {})
    words = {"name": str(Quoted(loc[-1])) if loc else "", "input": Quoted(error.get("input")),
             "i": next((p for p in loc if isinstance(p, int)), None), "object": _object(loc),
             "parent": _object(loc[:-1])}
    if error["type"] == _WORDED:
        return {**words, **ctx["values"]}
    return {**words, **{key: _bound(ctx[key]) for key in ("ge", "gt", "le") if key in ctx}}


def _api_error(exc: ValidationError) -> ApiError:
    """A body's first fault as the API words it: the one place pydantic's errors become ApiErrors."""
    error = _first(exc.errors(include_url=False))
    if error["type"] == _WORDED:  # worded where it was found
        ctx = error["ctx"]
        message, param, status, code = ctx["message"], ctx["param"], ctx["status"], ctx["code"]
    else:
        (message, param), status, code = _WORDING.get(error["type"], _UNLISTED), 400, None
    words = _words(error)
    return ApiError(status, message.format(**words), param=param and param.format(**words), code=code)


class Quoted:
    """A value a message quotes back to the client, cut to ECHO_CHARS (a 10 MB field is not sent back)."""

    def __init__(self, value: object) -> None:
        self.value = value

    @staticmethod
    def _cut(text: str) -> str:
        return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."

    def __repr__(self) -> str:
        return self._cut(repr(self.value))

    def __str__(self) -> str:
        return self._cut(str(self.value))


def _object(loc: tuple) -> str:
    """What a message calls the object at `loc`: the request, the 'specula' extension, the 'server' object."""
    return _OBJECTS.get(loc) or "'" + ".".join(map(str, loc)) + "' object"


def _validate(model: type[BaseModel], body: object, context: object = None) -> Any:
    """`body` as `model`, or the ApiError for its first fault."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        raise _api_error(exc) from None


# ---- what a field may hold, with its own wording where it has one ----------------------------------------


def _says(message: str, param: str | None = None, *, only: tuple[str, ...] = (), **values: object) -> WrapValidator:
    """A field worded as a whole: a fault pydantic finds in it (of the kinds in `only`, if given) is this
    message; faults worded deeper inside keep their own."""

    def reword(value: object, handler: Callable) -> object:
        try:
            return handler(value)
        except ValidationError as exc:
            first = _first(exc.errors(include_url=False))
            if first["type"] == _WORDED or (only and first["type"] not in only):
                raise
            raise _fault(message, param, **values) from None

    return WrapValidator(reword)


def _honoured_if(accepts: Callable[[Any], bool], message: str, param: str | None) -> AfterValidator:
    """An OpenAI field the engine honours only at its default value: anything else is refused, not ignored."""

    def check(value: object) -> object:
        if not accepts(value):
            raise _fault(message, param)
        return value

    return AfterValidator(check)


def _required() -> Any:
    """A required field validated when missing too, so that a missing one gets the wording of a wrong one."""
    return Field(None, validate_default=True)


def _or_none(value: object) -> object:
    """An empty or false object is no object: `{}` or null ask for the defaults."""
    return value or None


def _served(model: str | None, info: ValidationInfo) -> str | None:
    """'model' names this server's model (by any of its names); empty means that one."""
    served = info.context.model_ids
    if model not in (None, "") and model not in served:
        raise _fault("the model '{input}' does not exist here; this server serves '{served}'", "model", 404,
                     "model_not_found", served=served[0])
    return model


def _known(strategy: str) -> str:
    """A strategy of the catalogue (a load's `prepare`: what the model can use is known once it loaded)."""
    if strategy not in STRATEGIES:
        raise _fault(_UNKNOWN_STRATEGY, "prepare.strategy", choices=", ".join(STRATEGIES))
    return strategy


def _usable(strategy: str, info: ValidationInfo) -> str:
    """A strategy the loaded model can use (one of the catalogue, or the loaded backend's own)."""
    usable = info.context.strategies
    if strategy not in STRATEGIES and strategy not in usable:
        raise _fault(_UNKNOWN_STRATEGY, "specula.strategy", choices=", ".join(usable))
    if strategy not in usable:
        raise _fault("the loaded model cannot use '{input}' (it needs a draft model or a trained head); "
                     "it can use: {usable}", "specula.strategy", usable=", ".join(usable))
    return strategy


def _at_most_stops(stop: str | list[str] | None) -> str | list[str] | None:
    # counted after the shape (not max_length, which pydantic checks first): a bad shape is reported first
    if isinstance(stop, list) and len(stop) > MAX_STOPS:
        raise _fault("'stop' takes at most {most} sequences", "stop", most=MAX_STOPS)
    return stop


def _content(value: object, handler: Callable) -> object:
    """A message's content: a string, or content parts that are all text."""
    try:
        return handler(value)
    except ValidationError:
        message = ("messages[{i}]: only text content parts are supported" if isinstance(value, list) else
                   "messages[{i}] needs a 'content' string")
        raise _fault(message, "messages[{i}].content") from None


def _option(option: StrategyOption) -> tuple[Any, None]:
    """specula.options.NAME: exactly what the strategies' schema accepts for it (StrategyOption.accepts)."""

    def check(value: object) -> object:
        if not option.accepts(value):
            raise _fault("'specula.options.{name}' must be {kinds}, got {input!r}", "specula.options.{name}",
                         name=option.name, kinds=" or ".join(kind.__name__ for kind in option.kinds))
        return value

    return Annotated[Any, AfterValidator(check)], None


_UNKNOWN_STRATEGY = "unknown strategy {input!r}: choose one of {choices}"
_PENALTY = "'{0}' is not supported (it would change the model's own distribution)"
_NO_ECHO = "'echo', 'suffix' and 'best_of' are not supported"

# What the fields hold; a request's null is the field's default, unless a field says otherwise.
Flag = bool | None
Count = Annotated[int | None, Field(ge=1)]
Temperature = Annotated[float | None, Field(ge=0, le=2)]
TopP = Annotated[float | None, Field(gt=0, le=1)]
TopK = Annotated[int | None, Field(ge=0)]
Seed = Annotated[int | None, Field(ge=-(1 << 63), le=(1 << 64) - 1)]  # what a generator's seed can hold
User = Annotated[str | None, _says("'user' must be a string", "user")]
ModelName = Annotated[str | None, _says("'model' must be a string", "model"), AfterValidator(_served)]
Stop = Annotated[str | list[str] | None, _says("'stop' must be a string or a list of strings", "stop"),
                 AfterValidator(_at_most_stops)]
Role = Literal[tuple(ROLES)]
NonEmpty = Annotated[str, Field(min_length=1)]

# OpenAI's fields the engine honours only at their defaults
OneChoice = Annotated[int | None, _honoured_if(lambda n: n in (None, 1), "'n' must be 1: one answer per request", "n")]
PresencePenalty = Annotated[float | None, _honoured_if(lambda penalty: penalty in (None, 0),
                                                       _PENALTY.format("presence_penalty"), "presence_penalty")]
FrequencyPenalty = Annotated[float | None, _honoured_if(lambda penalty: penalty in (None, 0),
                                                        _PENALTY.format("frequency_penalty"), "frequency_penalty")]
LogitBias = Annotated[Any, _honoured_if(lambda bias: not bias, "'logit_bias' is not supported", "logit_bias")]
Logprobs = Annotated[Any, _honoured_if(lambda logprobs: logprobs in (None, False, 0), "'logprobs' is not supported; "
                                       "the 'specula' extension of each chunk carries the tokens", "logprobs")]
TopLogprobs = Annotated[Any, _honoured_if(lambda top: top is None, "'top_logprobs' is not supported", "top_logprobs")]
Tools = Annotated[Any, _honoured_if(lambda tools: not tools, "'tools' are not supported", "tools")]
ResponseFormat = Annotated[Any, _honoured_if(lambda fmt: fmt in (None, {"type": "text"}),
                                             "only the text 'response_format' is supported", "response_format")]
Echo = Annotated[Any, _honoured_if(lambda echo: not echo, _NO_ECHO, None)]
BestOf = Annotated[Any, _honoured_if(lambda best_of: best_of in (None, 1), _NO_ECHO, None)]


class _Body(BaseModel):
    """A JSON object of a request body: exact JSON types, finite numbers, no unknown fields. Fields are
    declared in the order they are checked, so that a body with several faults reports the first."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


StrategyOptions = create_model(
    "StrategyOptions", __base__=_Body, __doc__="`specula.options`: a field for each of the strategies' options.",
    **{name: _option(option) for name, option in STRATEGY_OPTIONS.items()})


class SpeculaExtension(_Body):
    """The `specula` object of a request: the strategy, its draft length and its options."""

    strategy: Annotated[str, _says(_UNKNOWN_STRATEGY, "specula.strategy", choices=", ".join(STRATEGIES)),
                        AfterValidator(_usable)] = None  # absent: the server's; null is refused
    k: Count = None
    adaptive_k: Flag = None
    token_probs: Flag = None
    cut_at_window: Flag = None  # max_tokens beyond the window's room ends the answer there instead of a 400
    k_max: Count = None
    options: Annotated[StrategyOptions | None, BeforeValidator(_or_none)] = None


class StreamOptions(_Body):
    """`stream_options`: whether the last chunk carries the usage."""

    include_usage: Flag = None
    continuous_usage_stats: Any = None  # vLLM's; accepted, not read


Extension = Annotated[SpeculaExtension | None, BeforeValidator(_or_none)]
Streaming = Annotated[StreamOptions | None, _says("'stream_options' takes only 'include_usage'", "stream_options",
                                                  only=("model_type", "extra_forbidden"))]


class TextPart(BaseModel):
    """A content part of a message: text only (other fields of a part are ignored)."""

    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message: its role and its text. Other fields (name, ...) are ignored."""

    model_config = ConfigDict(strict=True)
    role: Annotated[Role, _says("messages[{i}] has role {input!r}: use system, user or assistant",
                                "messages[{i}].role")] = _required()
    content: Annotated[str | list[TextPart], WrapValidator(_content)] = _required()

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


Messages = Annotated[list[Annotated[ChatMessage, _says("messages[{i}] must be an object", "messages[{i}]")]],
                     Field(min_length=1), _says("'messages' must be a non-empty list", "messages")]
Prompt = Annotated[NonEmpty | Annotated[list[NonEmpty], Field(min_length=1, max_length=1)],
                   _says("'prompt' must be a non-empty string (one prompt per request)", "prompt")]


class _Generation(_Body):
    """What the chat and completion endpoints share: the OpenAI fields refused, then the sampling and
    streaming settings. (Fields are checked in this order, the endpoint's own after these.)"""

    n: OneChoice = None
    presence_penalty: PresencePenalty = None
    frequency_penalty: FrequencyPenalty = None
    logit_bias: LogitBias = None
    logprobs: Logprobs = None
    user: User = None
    stream: Flag = None
    stream_options: Streaming = None
    specula: Extension = None
    max_tokens: Count = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    seed: Seed = None
    model: ModelName = None
    stop: Stop = None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_Generation):
    """POST /v1/chat/completions."""

    tools: Tools = None
    response_format: ResponseFormat = None
    top_logprobs: TopLogprobs = None
    messages: Messages = _required()
    max_completion_tokens: Count = None
    tool_choice: Any = None  # accepted, not read: no tools are
    parallel_tool_calls: Any = None
    # OpenAI's fields that change nothing here: accepted and not read (nothing is stored, there is one tier)
    store: Annotated[bool | None, _says("'store' must be true or false", "store")] = None
    metadata: Annotated[dict[str, str] | None, _says("'metadata' must be an object of strings", "metadata")] = None
    service_tier: Annotated[str | None, _says("'service_tier' must be a string", "service_tier")] = None
    prompt_cache_key: Annotated[str | None, _says("'prompt_cache_key' must be a string", "prompt_cache_key")] = None
    safety_identifier: Annotated[str | None, _says("'safety_identifier' must be a string", "safety_identifier")] = None
    modalities: Annotated[Any, _honoured_if(lambda kinds: kinds in (None, ["text"]), "only the 'text' modality is "
                                            "supported", "modalities")] = None

    @model_validator(mode="before")
    @classmethod
    def _unread(cls, body: object) -> object:
        """max_completion_tokens replaces max_tokens: when it is given, max_tokens is neither read nor checked."""
        if isinstance(body, dict) and body.get("max_completion_tokens") is not None and "max_tokens" in body:
            return {name: value for name, value in body.items() if name != "max_tokens"}
        return body

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens if self.max_completion_tokens is None else self.max_completion_tokens


class CompletionRequest(_Generation):
    """POST /v1/completions: one prompt."""

    echo: Echo = None
    suffix: Echo = None
    best_of: BestOf = None
    prompt: Prompt = _required()

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# ---- a validated body -> the engine's request --------------------------------------------------------------


def _options(options: StrategyOptions | None) -> tuple[tuple[str, object], ...]:
    """GenerateRequest.options: the options given, by name, booleans as 0 or 1."""
    given = options.model_dump(exclude_unset=True) if options is not None else {}
    return tuple(sorted((name, int(value) if isinstance(value, bool) else value) for name, value in given.items()))


def _decode(body: ChatCompletionRequest | CompletionRequest, ext: SpeculaExtension, strategy: str,
            defaults: Defaults) -> DecodeConfig:
    """The request's decoding settings: what the body gives, else OpenAI's defaults and the server's k."""
    server_k = defaults.k if defaults.k is not None and strategy == defaults.strategy else default_k(strategy)
    k_max = {} if ext.k_max is None else {"k_max": ext.k_max}
    model = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, **dict(defaults.sampling)}
    given = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
    sampling = {name: model[name] if value is None else value for name, value in given.items()}
    try:
        return DecodeConfig.for_strategy(
            strategy, server_k if ext.k is None else ext.k, adaptive_k=bool(ext.adaptive_k),
            token_probs=bool(ext.token_probs), max_new_tokens=body.max_new_tokens or defaults.context_window or 1 << 30,
            fit_window=body.max_new_tokens is not None and not ext.cut_at_window, seed=body.seed, **sampling, **k_max)
    except SpeculaError as exc:
        raise _bad(str(exc), "specula") from None


def model_sampling(generation_config: object) -> tuple[tuple[str, float], ...]:
    """The sampling fields a model's generation_config.json sets (those that differ from transformers'
    defaults), as Defaults.sampling: temperature, top_p and top_k."""
    try:
        given = generation_config.to_diff_dict() if generation_config is not None else {}
    except Exception:  # a config object of another kind: no defaults from it
        return ()
    out = []
    for name, kind in (("temperature", float), ("top_p", float), ("top_k", int)):
        value = given.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            out.append((name, kind(value)))
    return tuple(out)


def _parsed(body: ChatCompletionRequest | CompletionRequest, defaults: Defaults,
            messages: tuple[Message, ...], kind: str) -> Parsed:
    """A validated body as the engine's request and how to answer it; what it leaves out, the server's."""
    if body.stream_options is not None and not body.stream:  # as OpenAI and vLLM answer it
        raise ApiError(400, "'stream_options' is allowed only with 'stream': true", param="stream_options")
    ext = body.specula or SpeculaExtension()
    strategy = defaults.strategy if ext.strategy is None else ext.strategy
    request = GenerateRequest(messages, strategy, _decode(body, ext, strategy, defaults), chat=kind == "chat",
                              options=_options(ext.options))
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    include_usage = body.stream_options is not None and bool(body.stream_options.include_usage)
    return Parsed(request, kind, defaults.model_ids[0], bool(body.stream), include_usage, tuple(s for s in stops if s))


def parse_chat(body: object, defaults: Defaults) -> Parsed:
    chat = _validate(ChatCompletionRequest, body, defaults)
    return _parsed(chat, defaults, tuple(Message(ROLES[m.role], m.text) for m in chat.messages), "chat")


def parse_completion(body: object, defaults: Defaults) -> Parsed:
    completion = _validate(CompletionRequest, body, defaults)
    return _parsed(completion, defaults, (Message("user", completion.text),), "completion")


# ---- responses ---------------------------------------------------------------------------------------


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_reason(finished: Finished, stopped: bool) -> str:
    """OpenAI's finish_reason: "length" where the budget ended the answer, else "stop" (an end token, a stop
    sequence, a cancelled request: the extension's "reason" says which)."""
    return "length" if finished.reason == "length" and not stopped else "stop"


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
                                 token.p, token.q, token.branch, token.drafter))
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


def _typed(name: str, kind: type) -> Any:
    """A field of the `server` object: exactly of `kind` (null too is refused)."""
    return Annotated[kind, _says(f"'server.{name}' must be {kind.__name__}", f"server.{name}")]


_TEXTS = _says("'device', 'dtype' and 'weights' must be strings (weights: {weights})", weights=", ".join(WEIGHT_NAMES))
Source = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1),
                   _says("'model' must name a model: bundled, a folder, a .gguf file or a Hub id", "model")]
TrainKind = Annotated[Literal[TRAIN_KINDS], _says("'kind' must be {kinds}", "kind", kinds=" or ".join(TRAIN_KINDS))]


class ServerBody(_Body):
    """`server` in POST /specula/v1/load: another OpenAI-compatible server (vLLM) to relay."""

    url: _typed("url", str) = ""
    model: _typed("model", str) = ""
    api_key_env: _typed("api_key_env", str) = ""  # refused unless the server allows that name (routes.load)
    api_key: _typed("api_key", str) = ""  # the caller's own key for that server
    baseline_url: _typed("baseline_url", str) = ""
    verify_tls: _typed("verify_tls", bool) = True

    @model_validator(mode="after")
    def _has_url(self) -> ServerBody:
        # a model validator, not the field's own: every field's type is reported before a missing url
        if not self.url:
            raise _fault("'server.url' is required", "server.url")
        return self


class _LoadFields(_Body):
    """The fields POST /specula/v1/load may hold."""

    server: Any = None
    model: Any = None
    device: Any = None
    dtype: Any = None
    weights: Any = None
    draft: Any = None
    draft_head: Any = None
    measure_baseline: Any = None
    prepare: Any = None


class RemoteLoadBody(_LoadFields):
    """A load with `server`: that server is relayed, and the other fields are not read."""

    server: ServerBody


class PrepareBody(_Body):
    """`prepare` in a load: an answer as the first ones will ask, in the `specula` extension's fields; the
    load makes its drafter and runs a short answer with it before it says it is ready."""

    strategy: Annotated[str, _says(_UNKNOWN_STRATEGY, "prepare.strategy", choices=", ".join(STRATEGIES)),
                        AfterValidator(_known)]
    k: Count = None
    adaptive_k: Flag = None
    token_probs: Flag = None
    cut_at_window: Flag = None
    k_max: Count = None
    options: Annotated[StrategyOptions | None, BeforeValidator(_or_none)] = None


class LoadBody(_LoadFields):
    """A load without `server`: a model to load here."""

    server: None = None
    model: Source = _required()
    device: Annotated[str, _TEXTS] = "auto"
    dtype: Annotated[str, _TEXTS] = "auto"
    weights: Annotated[Literal[WEIGHT_NAMES], _TEXTS] = "auto"
    draft: Annotated[str | None, _says("'draft' must be a model source", "draft")] = None
    draft_head: Annotated[str | None,
                          _says("'draft_head' must be a draft head's folder or Hub id", "draft_head")] = None
    measure_baseline: Flag = None
    prepare: Annotated[PrepareBody | None, BeforeValidator(_or_none)] = None


class TrainBody(_Body):
    """POST /specula/v1/train: which head to train, and how long."""

    kind: TrainKind = "eagle"
    tokens: Count = None
    epochs: Count = None
    batch: Count = None


def parse_load(body: object) -> LoadRequest | RemoteLoadRequest:
    """POST /specula/v1/load: a model to load here, or (with "server") a server to relay."""
    # chosen here, not by a pydantic union: a union's tag would enter the path of every fault it reports
    if isinstance(body, dict) and body.get("server") is not None:
        server = _validate(RemoteLoadBody, body).server
        return RemoteLoadRequest(server.url, server.model, server.api_key_env, server.baseline_url, server.verify_tls,
                                 api_key=server.api_key)
    load = _validate(LoadBody, body)
    spec = ModelSpec(load.model, load.device, load.dtype, load.weights)
    return LoadRequest(spec, load.draft or None, measure_baseline=load.measure_baseline is not False,
                       draft_head=load.draft_head or None, prepare=_prepared(load.prepare))


def _prepared(ext: PrepareBody | None) -> GenerateRequest | None:
    """A load's `prepare` as the answer it stands for (no messages: the engine gives its own)."""
    if ext is None:
        return None
    try:
        config = DecodeConfig.for_strategy(ext.strategy, ext.k, adaptive_k=bool(ext.adaptive_k),
                                           token_probs=bool(ext.token_probs), fit_window=not ext.cut_at_window,
                                           **({} if ext.k_max is None else {"k_max": ext.k_max}))
    except SpeculaError as exc:
        raise _bad(str(exc), "prepare") from None
    return GenerateRequest((), ext.strategy, config, options=_options(ext.options))


def parse_train(body: object) -> TrainRequest:
    """POST /specula/v1/train: which head to train, and how long."""
    train = _validate(TrainBody, body)
    numbers = {name: getattr(train, name) for name in ("tokens", "epochs", "batch") if getattr(train, name) is not None}
    return TrainRequest(train.kind, **numbers)
