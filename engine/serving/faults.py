"""The API's errors, and the vocabulary a request body's fields are declared in, for `specula serve`.

An `ApiError` is an error in OpenAI's shape, with the right HTTP status and a one-line message; `failure` is
what a failed engine request becomes. Request bodies are pydantic models (`Body`: exact JSON types, 1 is not
true and 2.0 is not an integer; finite numbers; no unknown fields), and `validate` is the one place pydantic's
faults become ApiErrors: a body reports its first fault, worded by the table here or by the field itself
(`says`, `honoured_if`, `fault`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WrapValidator
from pydantic_core import PydanticCustomError

ECHO_CHARS = 80  # the most of a request's own value an error message repeats


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
    "GGUFError": (400, "invalid_request_error", None),  # a damaged file the load request named
    "SpeculaError": (400, "invalid_request_error", None),
    "OutOfMemoryError": (503, "server_error", "out_of_memory"),
    "ModelFileChanged": (503, "server_error", "model_file_changed"),  # until the model is loaded again
    "TrainingCancelled": (409, "cancelled", "cancelled"),  # asked for: not the server's failure
}


def failure(kind: str, message: str) -> ApiError:
    status, type_, code = _FAILURES.get(kind, (500, "server_error", None))
    return ApiError(status, message, type_, code=code, kind=kind)


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 for a request the engine refused (its message says why)."""
    return ApiError(400, message, param=param)


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


# ---- from pydantic's errors to the API's ---------------------------------------------------------------

_WORDED = "specula"  # the type of a pydantic error that already carries the API's wording (fault)

# pydantic's own faults in the API's words, by the fault's type: (message, param). They may say {name} (the
# field), {input!r} (the value given), {object} (the object at the fault's place), {parent} (the object that
# holds the field) and {ge}, {gt}, {le} (a number's bound): _words. Fields that need other words say so
# themselves (says, fault); a fault of a type not listed here is _UNLISTED.
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


def fault(message: str, param: str | None = None, status: int = 400, code: str | None = None,
          **values: object) -> PydanticCustomError:
    """A fault in the API's words, raised by a field's validator. `message` and `param` may say what `_words`
    gives ({i}, the list index in the fault's path, as in messages[{i}]; {input!r}, the value given) and any of
    `values`; `_api_error` fills them in."""
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


def _object(loc: tuple) -> str:
    """What a message calls the object at `loc`: the request, the 'specula' extension, the 'server' object."""
    return _OBJECTS.get(loc) or "'" + ".".join(map(str, loc)) + "' object"


def _words(error: dict) -> dict[str, object]:
    """What a fault's message and param may say: the field's {name}, the {input} given (cut short), the list index
    {i} in its path (as in messages[{i}]), the {object} at its place and the {parent} that holds it, a number's
    bound ({ge}, {gt}, {le}), and a fault in the API's words its own values (fault)."""
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


def validate(model: type[BaseModel], body: object, context: object = None) -> Any:
    """`body` as `model`, or the ApiError for its first fault."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        raise _api_error(exc) from None


# ---- what a field may hold, with its own wording where it has one ----------------------------------------


class Body(BaseModel):
    """A JSON object of a request body: exact JSON types, finite numbers, no unknown fields. Fields are
    declared in the order they are checked, so that a body with several faults reports the first."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def says(message: str, param: str | None = None, *, only: tuple[str, ...] = (), **values: object) -> WrapValidator:
    """A field worded as a whole: a fault pydantic finds in it (of the kinds in `only`, if given) is this
    message; faults worded deeper inside keep their own."""

    def reword(value: object, handler: Callable) -> object:
        try:
            return handler(value)
        except ValidationError as exc:
            first = _first(exc.errors(include_url=False))
            if first["type"] == _WORDED or (only and first["type"] not in only):
                raise
            raise fault(message, param, **values) from None

    return WrapValidator(reword)


def honoured_if(accepts: Callable[[Any], bool], message: str, param: str | None) -> AfterValidator:
    """An OpenAI field the engine honours only at its default value: anything else is refused, not ignored."""

    def check(value: object) -> object:
        if not accepts(value):
            raise fault(message, param)
        return value

    return AfterValidator(check)


def required() -> Any:
    """A required field validated when missing too, so that a missing one gets the wording of a wrong one."""
    return Field(None, validate_default=True)


def or_none(value: object) -> object:
    """An empty or false object is no object: `{}` or null ask for the defaults."""
    return value or None


# What the fields hold; a request's null is the field's default, unless a field says otherwise.
Flag = bool | None
Count = Annotated[int | None, Field(ge=1)]
