"""vLLM's speculative decoding counters, read from its Prometheus `/metrics` page.

vLLM counts, for the whole server (every request of every client):
- `vllm:spec_decode_num_drafts_total`: steps in which a draft was proposed
- `vllm:spec_decode_num_draft_tokens_total`: draft tokens proposed
- `vllm:spec_decode_num_accepted_tokens_total`: draft tokens the target accepted
- `vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}`: accepted at draft position i

The difference of two readings is what happened in between. With one request running, that is the
request's own speculation; with several, it is all of them (the UI says so).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

PREFIX = "vllm:spec_decode_"
MAX_POSITIONS = 256  # draft positions beyond this are ignored: no server drafts so far, and a huge label must not
# make the client allocate a counter for every position up to it
_TOTALS = ("num_drafts_total", "num_draft_tokens_total", "num_accepted_tokens_total")
_PER_POSITION = "num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: tuple[float, ...] = ()  # accepted at draft position 0, 1, ...

    def __sub__(self, earlier: SpecCounters) -> SpecCounters:
        n = max(len(self.per_position), len(earlier.per_position))
        mine = self.per_position + (0.0,) * (n - len(self.per_position))
        theirs = earlier.per_position + (0.0,) * (n - len(earlier.per_position))
        return SpecCounters(self.drafts - earlier.drafts, self.draft_tokens - earlier.draft_tokens,
                            self.accepted - earlier.accepted, tuple(a - b for a, b in zip(mine, theirs)))

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / proposed draft tokens."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens per target step in steps that had a draft: 1 (the target's own) + accepted drafts."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def position_rates(self) -> tuple[float, ...]:
        """Acceptance at each draft position: accepted there / drafts."""
        return tuple(a / self.drafts for a in self.per_position) if self.drafts > 0 else ()


def spec_samples(text: str) -> Iterator[Sample]:
    """The spec-decode samples of a Prometheus text page, with their sample names as written (`..._total`).

    Each line is handed to prometheus_client's parser on its own: its parser rejects a whole page for one
    line it cannot read, and a server's page must cost only that line, never the counters or an error."""
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        try:
            families = list(text_string_to_metric_families(line))
        except ValueError:
            continue
        for family in families:
            yield from family.samples


def parse_metrics(text: str, model: str | None = None) -> SpecCounters | None:
    """The spec-decode counters in a Prometheus text page, summed over engines; None when the page has
    none (a server without speculative decoding, or not vLLM). `model` keeps only that model's series
    where the page labels series by model."""
    values = dict.fromkeys(_TOTALS, 0.0)
    positions: dict[int, float] = {}
    found = False
    for sample in spec_samples(text):
        if model is not None and sample.labels.get("model_name", model) != model:
            continue
        short, value = sample.name[len(PREFIX):], float(sample.value)
        if short in values:
            values[short] += value
            found = True
        elif short == _PER_POSITION and sample.labels.get("position", "").isdigit():
            position = int(sample.labels["position"])
            if position < MAX_POSITIONS:
                positions[position] = positions.get(position, 0.0) + value
    if not found:
        return None
    per_position = tuple(positions.get(i, 0.0) for i in range(max(positions) + 1)) if positions else ()
    return SpecCounters(*(values[short] for short in _TOTALS), per_position)
