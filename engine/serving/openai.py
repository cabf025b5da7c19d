"""OpenAI's chat and completions request bodies, with the `specula` extension, for `specula serve`.

The bodies are pydantic models here, as vLLM's protocol module has them (ChatCompletionRequest,
CompletionRequest), declared in the vocabulary of `faults.py` (exact JSON types, unknown fields refused, each
fault worded for the client); `parse_chat` and `parse_completion` make a validated body an engine
`GenerateRequest` and say how to answer it (`Parsed`). Fields OpenAI defines that the engine cannot honour
(n > 1, penalties, tools, logprobs) are refused rather than ignored, so a client never gets an answer to a
question it did not ask.

The extension object, in a request: `"specula": {"strategy": "eagle", "k": 6, "adaptive_k": true,
"k_max": 12, "options": {"max_n": 3}}`. The answers' shapes are `replies.py`'s; the control endpoints'
bodies are `control.py`'s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic import WrapValidator, create_model, model_validator

from ..api.errors import SpeculaError
from ..api.prompts import Message
from ..api.strategies import STRATEGIES, STRATEGY_OPTIONS, StrategyOption, default_k
from ..api.types import SEED_MAX, SEED_MIN, DecodeConfig, GenerateRequest
from .faults import ApiError, Body, Count, Flag, bad_request, fault, honoured_if, or_none, required, says, validate

MAX_STOPS = 4
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
UNKNOWN_STRATEGY = "unknown strategy {input!r}: choose one of {choices}"


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


def _served(model: str | None, info: ValidationInfo) -> str | None:
    """'model' names this server's model (by any of its names); empty means that one."""
    served = info.context.model_ids
    if model not in (None, "") and model not in served:
        raise fault("the model '{input}' does not exist here; this server serves '{served}'", "model", 404,
                    "model_not_found", served=served[0])
    return model


def _usable(strategy: str, info: ValidationInfo) -> str:
    """A strategy the loaded model can use (one of the catalogue, or the loaded backend's own)."""
    usable = info.context.strategies
    if strategy not in STRATEGIES and strategy not in usable:
        raise fault(UNKNOWN_STRATEGY, "specula.strategy", choices=", ".join(usable))
    if strategy not in usable:
        raise fault("the loaded model cannot use '{input}' (it needs a draft model or a trained head); "
                    "it can use: {usable}", "specula.strategy", usable=", ".join(usable))
    return strategy


def _at_most_stops(stop: str | list[str] | None) -> str | list[str] | None:
    # counted after the shape (not max_length, which pydantic checks first): a bad shape is reported first
    if isinstance(stop, list) and len(stop) > MAX_STOPS:
        raise fault("'stop' takes at most {most} sequences", "stop", most=MAX_STOPS)
    return stop


def _content(value: object, handler: Callable) -> object:
    """A message's content: a string, or content parts that are all text."""
    try:
        return handler(value)
    except ValidationError:
        message = ("messages[{i}]: only text content parts are supported" if isinstance(value, list) else
                   "messages[{i}] needs a 'content' string")
        raise fault(message, "messages[{i}].content") from None


def _option(option: StrategyOption) -> tuple[Any, None]:
    """specula.options.NAME: exactly what the strategies' schema accepts for it (StrategyOption.accepts)."""

    def check(value: object) -> object:
        if not option.accepts(value):
            raise fault("'specula.options.{name}' must be {kinds}, got {input!r}", "specula.options.{name}",
                        name=option.name, kinds=" or ".join(kind.__name__ for kind in option.kinds))
        return value

    return Annotated[Any, AfterValidator(check)], None


_PENALTY = "'{0}' is not supported (it would change the model's own distribution)"
_NO_ECHO = "'echo', 'suffix' and 'best_of' are not supported"

# What the fields hold; a request's null is the field's default, unless a field says otherwise.
Temperature = Annotated[float | None, Field(ge=0, le=2)]
TopP = Annotated[float | None, Field(gt=0, le=1)]
TopK = Annotated[int | None, Field(ge=0)]
Seed = Annotated[int | None, Field(ge=SEED_MIN, le=SEED_MAX)]  # what a generator's seed can hold
User = Annotated[str | None, says("'user' must be a string", "user")]
ModelName = Annotated[str | None, says("'model' must be a string", "model"), AfterValidator(_served)]
Stop = Annotated[str | list[str] | None, says("'stop' must be a string or a list of strings", "stop"),
                 AfterValidator(_at_most_stops)]
Role = Literal[tuple(ROLES)]
NonEmpty = Annotated[str, Field(min_length=1)]
LeaveOut = Annotated[list[str | list[Annotated[int, Field(ge=0, lt=1 << 31)]]] | None,
                     says("'specula.leave_out' must be a list of answers: strings or lists of token ids",
                          "specula.leave_out"), Field(max_length=64)]

# OpenAI's fields the engine honours only at their defaults
OneChoice = Annotated[int | None, honoured_if(lambda n: n in (None, 1), "'n' must be 1: one answer per request", "n")]
PresencePenalty = Annotated[float | None, honoured_if(lambda penalty: penalty in (None, 0),
                                                      _PENALTY.format("presence_penalty"), "presence_penalty")]
FrequencyPenalty = Annotated[float | None, honoured_if(lambda penalty: penalty in (None, 0),
                                                       _PENALTY.format("frequency_penalty"), "frequency_penalty")]
LogitBias = Annotated[Any, honoured_if(lambda bias: not bias, "'logit_bias' is not supported", "logit_bias")]
Logprobs = Annotated[Any, honoured_if(lambda logprobs: logprobs in (None, False, 0), "'logprobs' is not supported; "
                                      "the 'specula' extension of each chunk carries the tokens", "logprobs")]
TopLogprobs = Annotated[Any, honoured_if(lambda top: top is None, "'top_logprobs' is not supported", "top_logprobs")]
Tools = Annotated[Any, honoured_if(lambda tools: not tools, "'tools' are not supported", "tools")]
ResponseFormat = Annotated[Any, honoured_if(lambda fmt: fmt in (None, {"type": "text"}),
                                            "only the text 'response_format' is supported", "response_format")]
Echo = Annotated[Any, honoured_if(lambda echo: not echo, _NO_ECHO, None)]
BestOf = Annotated[Any, honoured_if(lambda best_of: best_of in (None, 1), _NO_ECHO, None)]


StrategyOptions = create_model(
    "StrategyOptions", __base__=Body, __doc__="`specula.options`: a field for each of the strategies' options.",
    **{name: _option(option) for name, option in STRATEGY_OPTIONS.items()})


class SpeculaExtension(Body):
    """The `specula` object of a request: the strategy, its draft length and its options."""

    strategy: Annotated[str, says(UNKNOWN_STRATEGY, "specula.strategy", choices=", ".join(STRATEGIES)),
                        AfterValidator(_usable)] = None  # absent: the server's; null is refused
    k: Count = None
    adaptive_k: Flag = None
    token_probs: Flag = None
    cut_at_window: Flag = None  # max_tokens beyond the window's room ends the answer there instead of a 400
    own_baseline: Flag = None  # the live speedup from this answer's own plain steps (DecodeConfig.own_baseline)
    learn: Flag = None  # false: the answer does not join what the drafters learn from answers (DecodeConfig.learn)
    leave_out: LeaveOut = None  # earlier answers the drafters leave out for this one (DecodeConfig.leave_out)
    k_max: Count = None
    options: Annotated[StrategyOptions | None, BeforeValidator(or_none)] = None


class StreamOptions(Body):
    """`stream_options`: whether the last chunk carries the usage."""

    include_usage: Flag = None
    continuous_usage_stats: Any = None  # vLLM's; accepted, not read


Extension = Annotated[SpeculaExtension | None, BeforeValidator(or_none)]
Streaming = Annotated[StreamOptions | None, says("'stream_options' takes only 'include_usage'", "stream_options",
                                                 only=("model_type", "extra_forbidden"))]


class TextPart(BaseModel):
    """A content part of a message: text only (other fields of a part are ignored)."""

    model_config = ConfigDict(strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message: its role and its text. Other fields (name, ...) are ignored."""

    model_config = ConfigDict(strict=True)
    role: Annotated[Role, says("messages[{i}] has role {input!r}: use system, user or assistant",
                               "messages[{i}].role")] = required()
    content: Annotated[str | list[TextPart], WrapValidator(_content)] = required()

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


Messages = Annotated[list[Annotated[ChatMessage, says("messages[{i}] must be an object", "messages[{i}]")]],
                     Field(min_length=1), says("'messages' must be a non-empty list", "messages")]
Prompt = Annotated[NonEmpty | Annotated[list[NonEmpty], Field(min_length=1, max_length=1)],
                   says("'prompt' must be a non-empty string (one prompt per request)", "prompt")]


class _Generation(Body):
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
    messages: Messages = required()
    max_completion_tokens: Count = None
    tool_choice: Any = None  # accepted, not read: no tools are
    parallel_tool_calls: Any = None
    # OpenAI's fields that change nothing here: accepted and not read (nothing is stored, there is one tier)
    store: Annotated[bool | None, says("'store' must be true or false", "store")] = None
    metadata: Annotated[dict[str, str] | None, says("'metadata' must be an object of strings", "metadata")] = None
    service_tier: Annotated[str | None, says("'service_tier' must be a string", "service_tier")] = None
    prompt_cache_key: Annotated[str | None, says("'prompt_cache_key' must be a string", "prompt_cache_key")] = None
    safety_identifier: Annotated[str | None, says("'safety_identifier' must be a string", "safety_identifier")] = None
    modalities: Annotated[Any, honoured_if(lambda kinds: kinds in (None, ["text"]), "only the 'text' modality is "
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
    prompt: Prompt = required()

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


# ---- a validated body -> the engine's request --------------------------------------------------------------


def request_options(options: StrategyOptions | None) -> tuple[tuple[str, object], ...]:
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
            fit_window=body.max_new_tokens is not None and not ext.cut_at_window, seed=body.seed,
            own_baseline=bool(ext.own_baseline), learn=ext.learn is not False, leave_out=_answers(ext.leave_out),
            **sampling, **k_max)
    except SpeculaError as exc:
        raise bad_request(str(exc), "specula") from None


def _answers(given: list | None) -> tuple:
    """specula.leave_out as DecodeConfig.leave_out: texts, and token ids as tuples."""
    return tuple(a if isinstance(a, str) else tuple(a) for a in given or ())


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
                              options=request_options(ext.options))
    stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
    include_usage = body.stream_options is not None and bool(body.stream_options.include_usage)
    return Parsed(request, kind, defaults.model_ids[0], bool(body.stream), include_usage, tuple(s for s in stops if s))


def parse_chat(body: object, defaults: Defaults) -> Parsed:
    chat = validate(ChatCompletionRequest, body, defaults)
    return _parsed(chat, defaults, tuple(Message(ROLES[m.role], m.text) for m in chat.messages), "chat")


def parse_completion(body: object, defaults: Defaults) -> Parsed:
    completion = validate(CompletionRequest, body, defaults)
    return _parsed(completion, defaults, (Message("user", completion.text),), "completion")

