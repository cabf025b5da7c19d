"""Requests and engine events as JSON: a GenerateRequest as an OpenAI request body (`request_body`, sent
by Specula's own client and by the remote backend to any server), and the events in the `specula`
extension of `specula serve`'s streams, written by the server (`serving/routes.py`) and read by its
client (`remote/client.py`). Torch-free.

A stream's first chunk carries `Started`, each step's chunk a `Step` (its tokens with their origin, the
rejected drafts, the draft and verify times), the last chunk `Finished` (the engine's own reason, the
totals, the speedup); a remote server's counters travel as chunks of their own (`server_stats`).
Reading back gives the same dataclasses the engine yields in process.
"""

from __future__ import annotations

from dataclasses import asdict, fields

from .events import (
    BaselineCost,
    Capabilities,
    Finished,
    Loaded,
    Origin,
    PromptProgress,
    ServerStats,
    Started,
    Step,
    Token,
    Totals,
)
from .types import GenerateRequest

_TOTALS = tuple(f.name for f in fields(Totals))


def request_body(request: GenerateRequest) -> dict:
    """The OpenAI body every server reads for a request: the chat's messages (or, without the chat
    template, the turns as one prompt, as prompts.encode joins them), the length and sampling settings,
    streamed. Each sender adds what its server takes beyond that."""
    config, params = request.config, request.config.params
    body: dict = {"max_tokens": config.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
                  "stream": True}
    if config.seed is not None:
        body["seed"] = config.seed
    if request.chat:
        body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
    else:
        body["prompt"] = "\n\n".join(m.content for m in request.messages)
    return body


def extension_json(request: GenerateRequest) -> dict:
    """The `specula` object of a request to Specula's own server: the strategy, its draft length and options."""
    config = request.config
    ext = {"strategy": request.strategy, "k": config.k, "adaptive_k": config.adaptive_k, "k_max": config.k_max,
           "options": dict(request.options)}
    if config.token_probs:
        ext["token_probs"] = True
    if not config.fit_window:  # as the engine decodes locally: an answer may end at the window's end
        ext["cut_at_window"] = True
    if config.own_baseline:
        ext["own_baseline"] = True
    if not config.learn:
        ext["learn"] = False
    if config.leave_out:
        ext["leave_out"] = [a if isinstance(a, str) else list(a) for a in config.leave_out]
    return ext


def token_json(token: Token) -> dict:
    out = {"id": token.id, "text": token.text, "origin": token.origin.value}
    for name in ("draft_pos", "p", "q", "branch", "drafter"):
        value = getattr(token, name)
        if value is not None:
            out[name] = value
    return out


def token_from(data: dict, step: int) -> Token:
    return Token(int(data["id"]), str(data["text"]), Origin(data["origin"]), step, data.get("draft_pos"),
                 data.get("p"), data.get("q"), data.get("branch"), data.get("drafter"))


def started_json(event: Started) -> dict:
    out = {"request_id": event.request_id, "strategy": event.strategy, "prompt_tokens": event.prompt_tokens,
           "k": event.k}
    return {**out, "decoding_step": event.step} if event.step else out


def started_from(data: dict, request_id: int) -> Started:
    return Started(request_id, str(data.get("strategy", "")), int(data.get("prompt_tokens", 0)), int(data.get("k", 0)),
                   str(data.get("decoding_step", "")))


def progress_json(event: PromptProgress) -> dict:
    left = {} if event.estimate_s is None else {"left_s": round(event.estimate_s, 3)}
    return {"done": event.done, "total": event.total, "elapsed_s": round(event.elapsed_s, 3), **left}


def progress_from(data: dict, request_id: int) -> PromptProgress:
    left = data.get("left_s")
    return PromptProgress(request_id, int(data.get("done", 0)), int(data.get("total", 0)),
                          float(data.get("elapsed_s", 0.0)), float(left) if isinstance(left, (int, float)) else None)


def step_json(step: Step, tokens: list[Token] | tuple[Token, ...]) -> dict:
    """A step; `tokens` are those of its tokens this chunk releases (a stop sequence may hold some back)."""
    return {"step": step.step, "tokens": [token_json(t) for t in tokens],
            "rejected": [token_json(t) for t in step.rejected], "drafted": step.drafted, "accepted": step.accepted,
            "k": step.k, "draft_s": step.draft_s, "verify_s": step.verify_s, "context_len": step.context_len,
            "elapsed_s": step.elapsed_s, "inferred": step.inferred, "speedup": step.speedup,
            "speedup_err": step.speedup_err, "plain_step_s": step.plain_step_s}


def step_from(data: dict, request_id: int) -> Step:
    n = int(data["step"])
    return Step(request_id, n, int(data["drafted"]), int(data["accepted"]),
                tuple(token_from(t, n) for t in data.get("tokens", ())),
                tuple(token_from(t, n) for t in data.get("rejected", ())),
                float(data["draft_s"]), float(data["verify_s"]), int(data["context_len"]), int(data["k"]),
                float(data["elapsed_s"]), bool(data.get("inferred", False)), _number(data.get("speedup")),
                _number(data.get("speedup_err")), _number(data.get("plain_step_s")))


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def totals_json(totals: Totals, speedup: float | None = None, speedup_err: float | None = None,
                plain_step_s: float | None = None, plain_step_err: float | None = None) -> dict:
    """Every field of Totals (lists for tuples), and the figures derived from them."""
    out = {name: list(v) if isinstance(v, tuple) else v for name, v in asdict(totals).items()}
    out.update(acceptance_rate=totals.acceptance_rate, mean_accepted_length=totals.mean_accepted_length,
               tokens_per_s=totals.tokens_per_s, speedup=speedup, speedup_err=speedup_err, plain_step_s=plain_step_s,
               plain_step_err=plain_step_err)
    return out


def totals_from(data: dict) -> Totals:
    return Totals(**{name: tuple(data[name]) if isinstance(data[name], list) else data[name]
                     for name in _TOTALS if name in data})


def finished_json(event: Finished, tokens: list[Token] | tuple[Token, ...] = ()) -> dict:
    return {"request_id": event.request_id, "reason": event.reason, "tokens": [token_json(t) for t in tokens],
            "totals": totals_json(event.totals, event.speedup, event.speedup_err, event.plain_step_s,
                                  event.plain_step_err)}


def finished_from(data: dict, request_id: int, text: str, token_ids: tuple[int, ...], reason: str | None = None) -> Finished:
    totals = data.get("totals") or {}
    return Finished(request_id, reason or str(data.get("reason", "eos")), text, token_ids, totals_from(totals),
                    _number(totals.get("speedup")), _number(totals.get("speedup_err")),
                    _number(totals.get("plain_step_s")), _number(totals.get("plain_step_err")))


def stats_json(event: ServerStats) -> dict:
    return {name: list(v) if isinstance(v, tuple) else v for name, v in asdict(event).items() if name != "request_id"}


def stats_from(data: dict, request_id: int) -> ServerStats:
    return ServerStats(request_id, float(data["elapsed_s"]), int(data["drafts"]), int(data["draft_tokens"]),
                       int(data["accepted"]), tuple(data.get("position_accepted", ())))


def loaded_json(event: Loaded) -> dict:
    out = asdict(event)
    out.pop("request_id")
    baseline = event.baseline
    out["baseline_tokens_per_s"] = 1.0 / baseline.a if baseline is not None and baseline.a > 0 else None
    return out


def loaded_from(data: dict, request_id: int) -> Loaded:
    names = {f.name for f in fields(Loaded)} - {"request_id"}
    values = {k: v for k, v in data.items() if k in names}
    for name in ("strategies", "notes", "warnings"):
        values[name] = tuple(values.get(name) or ())
    baseline = values.get("baseline")
    values["baseline"] = BaselineCost(float(baseline["a"]), float(baseline["b"])) if baseline else None
    known = {f.name for f in fields(Capabilities)}
    values["capabilities"] = Capabilities(**{k: v for k, v in (values.get("capabilities") or {}).items() if k in known})
    return Loaded(request_id, **values)
