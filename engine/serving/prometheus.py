"""The /metrics page in Prometheus' text format, written by `prometheus_client`.

Where a counter means what vLLM's does, it has vLLM's name, so dashboards (and Specula's own remote
backend, `remote/telemetry.py`) read both servers alike: `vllm:spec_decode_num_drafts_total` (steps with a
draft), `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total`
(accepted at draft position i), `vllm:prompt_tokens_total`, `vllm:generation_tokens_total`,
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:request_success_total`. Specula's own
start with `specula_`. Every series has a `model_name` label.

The counters live in `EngineService.counters`; a custom collector reads them when the page is asked for,
so the page is always the service's state and no second copy of the counts is kept. Counter families
are named without `_total` (prometheus_client adds it to their samples) and get no `_created` samples.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .service import EngineService

_FAMILIES = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily}


def _one(kind: str, name: str, help_: str, model: str, value: float) -> Metric:
    """A family with a single series, labelled by the model only."""
    family = _FAMILIES[kind](name, help_, labels=["model_name"])
    family.add_metric([model], value)
    return family


def _by(kind: str, name: str, help_: str, model: str, label: str, values: Mapping) -> Metric:
    """A family with a series for each key of `values` (in its order) under `label`, besides the model's;
    with no keys it is still on the page, with its help and type, as dashboards expect."""
    family = _FAMILIES[kind](name, help_, labels=["model_name", label])
    for key, value in values.items():
        family.add_metric([model, str(key)], value)
    return family


def _vllm_families(service: EngineService, model: str) -> Iterator[Metric]:
    """The series vLLM also has, under vLLM's names."""
    c = service.counters
    yield _one("gauge", "vllm:num_requests_running", "Requests generating now.", model,
               1 if service.running is not None else 0)
    yield _one("gauge", "vllm:num_requests_waiting", "Requests queued behind the running one.", model,
               service.queue_depth)
    yield _one("counter", "vllm:prompt_tokens", "Prompt tokens read.", model, c.prompt_tokens)
    yield _one("counter", "vllm:generation_tokens", "Tokens generated.", model, c.generation_tokens)
    yield _by("counter", "vllm:request_success", "Requests finished, by reason.", model, "finished_reason",
              dict(sorted(c.requests.items())))
    yield _one("counter", "vllm:spec_decode_num_drafts", "Decode steps with a draft.", model, c.counts.drafts)
    yield _one("counter", "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", model, c.counts.drafted)
    yield _one("counter", "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", model, c.counts.accepted)
    yield _by("counter", "vllm:spec_decode_num_accepted_tokens_per_pos",
              "Draft tokens accepted at each draft position.", model, "position",
              dict(enumerate(c.counts.pos_accepted)))


def _specula_families(service: EngineService, model: str) -> Iterator[Metric]:
    """Specula's own series: origins, rejections, decoding time and the live speedup."""
    c = service.counters
    yield _one("counter", "specula_steps", "Decode steps (target forwards after the prefill).", model, c.counts.steps)
    yield _by("counter", "specula_tokens", "Tokens generated, by origin.", model, "origin",
              dict(sorted(c.tokens_by_origin.items())))
    yield _one("counter", "specula_rejected_tokens", "Draft tokens shown as rejected.", model, c.rejected_tokens)
    yield _one("counter", "specula_decode_seconds", "Wall time after each request's first token.", model,
               c.decode_s)
    yield _one("counter", "specula_decoded_tokens", "Tokens after each request's first.", model, c.decoded_tokens)
    yield _one("gauge", "specula_queue_depth", "Requests waiting for the engine.", model, service.queue_depth)
    yield _one("counter", "specula_speedup_plain_seconds",
               "Plain decoding's time for the finished requests' decoded tokens, measured in them (the live speedup).",
               model, c.speedup.plain_s)
    yield _one("counter", "specula_speedup_spent_seconds",
               "The time those tokens took: the speedup over an interval is the ratio of the two increases.",
               model, c.speedup.spent_s)
    if c.plain_step_s:
        yield _one("gauge", "specula_plain_tokens_per_second",
                   "Plain decoding speed, measured by the latest answer's plain steps.", model, 1.0 / c.plain_step_s)
    yield _one("gauge", "specula_model_loaded", "1 once a model is loaded.", model,
               1 if service.state == "ready" else 0)


class ServiceCollector(Collector):
    """Reads a service's counters into metric families each time a registry collects."""

    def __init__(self, service: EngineService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        loaded = self.service.loaded
        model = loaded.target if loaded is not None else ""
        yield from _vllm_families(self.service, model)
        yield from _specula_families(self.service, model)


def render(service: EngineService) -> str:
    """The page for `service` now, in the text format of version 0.0.4 (the route's content type)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(service))
    return generate_latest(registry).decode("utf-8")
