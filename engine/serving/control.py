"""The bodies of `specula serve`'s control endpoints: POST /specula/v1/load and POST /specula/v1/train.

A load names a model to load here (`LoadBody`, with an optional `prepare`: the first answers' strategy, in the
`specula` extension's fields) or another OpenAI-compatible server to relay (`RemoteLoadBody`); a train names
the head to train. `parse_load` and `parse_train` make a body the engine's request, or refuse it with the
ApiError for its first fault (`faults.py`); `check_sources` refuses a load whose model names no model before it is
queued.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, StringConstraints, model_validator

from ..api.errors import SpeculaError
from ..api.gguf_header import GGUFError, read_header
from ..api.paths import WEIGHT_NAMES, local_source
from ..api.strategies import STRATEGIES
from ..api.types import BUNDLED, DecodeConfig, GenerateRequest, LoadRequest, ModelChoice, RemoteLoadRequest, TrainRequest
from .faults import ApiError, Body, Count, Flag, bad_request, failure, fault, or_none, required, says, validate
from .openai import UNKNOWN_STRATEGY, StrategyOptions, request_options

TRAIN_KINDS = ("eagle", "eagle3", "medusa")


def _known(strategy: str) -> str:
    """A strategy of the catalogue (a load's `prepare`: what the model can use is known once it loaded)."""
    if strategy not in STRATEGIES:
        raise fault(UNKNOWN_STRATEGY, "prepare.strategy", choices=", ".join(STRATEGIES))
    return strategy


def _typed(name: str, kind: type) -> Any:
    """A field of the `server` object: exactly of `kind` (null too is refused)."""
    return Annotated[kind, says(f"'server.{name}' must be {kind.__name__}", f"server.{name}")]


_TEXTS = says("'device', 'dtype' and 'weights' must be strings (weights: {weights})", weights=", ".join(WEIGHT_NAMES))
Source = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1),
                   says("'model' must name a model: bundled, a folder, a .gguf file or a Hub id", "model")]
TrainKind = Annotated[Literal[TRAIN_KINDS], says("'kind' must be {kinds}", "kind", kinds=" or ".join(TRAIN_KINDS))]


class ServerBody(Body):
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
            raise fault("'server.url' is required", "server.url")
        return self


class _LoadFields(Body):
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
    keep_target: Any = None


class RemoteLoadBody(_LoadFields):
    """A load with `server`: that server is relayed, and the other fields are not read."""

    server: ServerBody


class PrepareBody(Body):
    """`prepare` in a load: an answer as the first ones will ask, in the `specula` extension's fields; the
    load makes its drafter and runs a short answer with it before it says it is ready."""

    strategy: Annotated[str, says(UNKNOWN_STRATEGY, "prepare.strategy", choices=", ".join(STRATEGIES)),
                        AfterValidator(_known)]
    k: Count = None
    adaptive_k: Flag = None
    token_probs: Flag = None
    cut_at_window: Flag = None
    k_max: Count = None
    options: Annotated[StrategyOptions | None, BeforeValidator(or_none)] = None


class LoadBody(_LoadFields):
    """A load without `server`: a model to load here."""

    server: None = None
    model: Source = required()
    device: Annotated[str, _TEXTS] = "auto"
    dtype: Annotated[str, _TEXTS] = "auto"
    weights: Annotated[Literal[WEIGHT_NAMES], _TEXTS] = "auto"
    draft: Annotated[str | None, says("'draft' must be a model source", "draft")] = None
    draft_head: Annotated[str | None,
                          says("'draft_head' must be a draft head's folder or Hub id", "draft_head")] = None
    measure_baseline: Flag = None
    prepare: Annotated[PrepareBody | None, BeforeValidator(or_none)] = None
    keep_target: Flag = None  # the model loaded now stays where it is this one: only the draft is read


class TrainBody(Body):
    """POST /specula/v1/train: which head to train, and how long."""

    kind: TrainKind = "eagle"
    tokens: Count = None
    epochs: Count = None
    batch: Count = None


def parse_load(body: object) -> LoadRequest | RemoteLoadRequest:
    """POST /specula/v1/load: a model to load here, or (with "server") a server to relay."""
    # chosen here, not by a pydantic union: a union's tag would enter the path of every fault it reports
    if isinstance(body, dict) and body.get("server") is not None:
        server = validate(RemoteLoadBody, body).server
        return RemoteLoadRequest(server.url, server.model, server.api_key_env, server.baseline_url, server.verify_tls,
                                 api_key=server.api_key)
    load = validate(LoadBody, body)
    spec = ModelChoice(load.model, load.device, load.dtype, load.weights)
    return LoadRequest(spec, load.draft or None, measure_baseline=load.measure_baseline is not False,
                       draft_head=load.draft_head or None, prepare=_prepared(load.prepare),
                       keep_target=load.keep_target is True)


def check_sources(load: LoadRequest) -> None:
    """A load's model and draft as far as they are known before the engine reads them (a load's progress streams
    under 200 once it is queued): a source that names no model (not found, a file that is no GGUF, a folder without
    config.json) or a GGUF whose header is damaged is refused with the ApiError the engine's failure would be. Reads
    a GGUF's header: call it off the event loop."""
    for param, source in (("model", load.target.source), ("draft", load.draft)):
        source = (source or "").strip()
        if not source or source == BUNDLED:
            continue
        try:
            kind, path = local_source(source)
            if kind == "gguf":
                _check_header(path)
        except SpeculaError as exc:
            error = failure(type(exc).__name__, str(exc))
            raise ApiError(error.status, error.message, error.type, param, error.code, error.kind) from None


def _check_header(path) -> None:
    """A GGUFError naming what is wrong with a GGUF's header and tensor table (no tensor is read), as the load's."""
    try:
        read_header(path, keep=lambda key: False)
    except GGUFError as exc:
        raise GGUFError(f"cannot read GGUF file {path.name}: {exc}") from None
    except OSError as exc:
        raise SpeculaError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None


def _prepared(ext: PrepareBody | None) -> GenerateRequest | None:
    """A load's `prepare` as the answer it stands for (no messages: the engine gives its own)."""
    if ext is None:
        return None
    try:
        config = DecodeConfig.for_strategy(ext.strategy, ext.k, adaptive_k=bool(ext.adaptive_k),
                                           token_probs=bool(ext.token_probs), fit_window=not ext.cut_at_window,
                                           **({} if ext.k_max is None else {"k_max": ext.k_max}))
    except SpeculaError as exc:
        raise bad_request(str(exc), "prepare") from None
    return GenerateRequest((), ext.strategy, config, options=request_options(ext.options))


def parse_train(body: object) -> TrainRequest:
    """POST /specula/v1/train: which head to train, and how long."""
    train = validate(TrainBody, body)
    numbers = {name: getattr(train, name) for name in ("tokens", "epochs", "batch") if getattr(train, name) is not None}
    return TrainRequest(train.kind, **numbers)
