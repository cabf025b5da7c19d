"""The /metrics page in Prometheus' text format.

Where a counter means what vLLM's does, it has vLLM's name, so dashboards (and Specula's own remote
backend, `remote/telemetry.py`) read both servers alike: `vllm:spec_decode_num_drafts_total` (steps with a
draft), `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total`
(accepted at draft position i), `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:request_success_total`. Specula's own
start with `specula_`.
"""

from __future__ import annotations

from .service import EngineService


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Page:
    def __init__(self, model: str) -> None:
        self.lines: list[str] = []
        self.model = _escape(model)

    def add(self, name: str, kind: str, help_: str, samples: list[tuple[dict, float]]) -> None:
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            pairs = {"model_name": self.model, **{k: _escape(str(v)) for k, v in labels.items()}}
            text = ",".join(f'{k}="{v}"' for k, v in pairs.items())
            self.lines.append(f"{name}{{{text}}} {float(value)!r}")

    def one(self, name: str, kind: str, help_: str, value: float) -> None:
        self.add(name, kind, help_, [({}, value)])


def render(service: EngineService) -> str:
    c = service.counters
    model = service.loaded.target if service.loaded is not None else ""
    page = _Page(model)
    page.one("vllm:num_requests_running", "gauge", "Requests generating now.", 1 if service.running is not None else 0)
    page.one("vllm:num_requests_waiting", "gauge", "Requests queued behind the running one.", service.queue_depth)
    page.one("vllm:prompt_tokens_total", "counter", "Prompt tokens read.", c.prompt_tokens)
    page.one("vllm:generation_tokens_total", "counter", "Tokens generated.", c.generation_tokens)
    page.add("vllm:request_success_total", "counter", "Requests finished, by reason.",
             [({"finished_reason": reason}, n) for reason, n in sorted(c.requests.items())])
    page.one("vllm:spec_decode_num_drafts_total", "counter", "Decode steps with a draft.", c.drafts)
    page.one("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", c.draft_tokens)
    page.one("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", c.accepted)
    page.add("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
             "Draft tokens accepted at each draft position.",
             [({"position": i}, n) for i, n in enumerate(c.accepted_per_position)])
    page.one("specula_steps_total", "counter", "Decode steps (target forwards after the prefill).", c.steps)
    page.add("specula_tokens_total", "counter", "Tokens generated, by origin.",
             [({"origin": origin}, n) for origin, n in sorted(c.tokens_by_origin.items())])
    page.one("specula_rejected_tokens_total", "counter", "Draft tokens shown as rejected.", c.rejected_tokens)
    page.one("specula_decode_seconds_total", "counter", "Wall time after each request's first token.", c.decode_s)
    page.one("specula_decoded_tokens_total", "counter", "Tokens after each request's first.", c.decoded_tokens)
    page.one("specula_queue_depth", "gauge", "Requests waiting for the engine.", service.queue_depth)
    page.one("specula_speedup_plain_seconds_total", "counter",
             "Plain decoding's time for the finished requests' decoded tokens, measured in them (the live speedup).",
             c.speedup.plain_s)
    page.one("specula_speedup_spent_seconds_total", "counter",
             "The time those tokens took: the speedup over an interval is the ratio of the two increases.",
             c.speedup.spent_s)
    if c.plain_step_s:
        page.one("specula_plain_tokens_per_second", "gauge",
                 "Plain decoding speed, measured by the latest answer's plain steps.", 1.0 / c.plain_step_s)
    page.one("specula_model_loaded", "gauge", "1 once a model is loaded.", 1 if service.state == "ready" else 0)
    return "\n".join(page.lines) + "\n"
