"""What generation yields: frozen dataclasses of plain Python values (never tensors).

A generation is `Started`, then one `Step` per target forward (the prefill included), then exactly one
of `Finished` or `Failed`. The worker adds `Loading`/`Loaded` around model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Origin(str, Enum):
    DRAFT = "draft"  # a draft token the target accepted
    CORRECTION = "correction"  # the target's token where a draft token was rejected
    BONUS = "bonus"  # the target's extra token after every draft token was accepted
    TARGET = "target"  # the target's token when nothing was drafted (plain decoding, prefill)
    REJECTED = "rejected"  # a draft token the target rejected (not part of the output)


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    origin: Origin
    step: int
    draft_pos: int | None = None  # 0-based position in the step's draft, for draft tokens
    p: float | None = None  # target probability of a draft token (sampling with a distribution)
    q: float | None = None  # drafter probability of a draft token
    branch: str | None = None  # a token-tree step: which branch won, e.g. "tree of 14 nodes, kept path 1·2·1"
    drafter: str | None = None  # a drafting step of a strategy that chooses among drafters (auto): its choice


@dataclass(frozen=True)
class Started:
    request_id: int
    strategy: str
    prompt_tokens: int
    k: int
    # the decoding step the answer starts on: "compiled", "compiling" (being built for this CPU: the answer
    # runs eager, slower, and its speedup is not like for like), "eager..."; "" where unknown (a server)
    step: str = ""


@dataclass(frozen=True)
class PromptProgress:
    """A long prompt being read: `done` of its `total` tokens after `elapsed_s` (sent after each chunk once
    reading takes over PROGRESS_AFTER_S, so that a long chat's first token is not minutes of silence)."""

    request_id: int
    done: int
    total: int
    elapsed_s: float
    estimate_s: float | None = None  # the reader's estimate of the rest (decoding.loop.reading_left), where it has one

    @property
    def left_s(self) -> float | None:
        """About how long the rest takes: the reader's estimate, else at the rate so far (None before any)."""
        if self.estimate_s is not None:
            return self.estimate_s
        return self.elapsed_s * (self.total - self.done) / self.done if self.done > 0 else None


@dataclass(frozen=True)
class Step:
    request_id: int
    step: int  # 0 is the prefill
    drafted: int  # draft tokens proposed
    accepted: int  # of those, kept
    tokens: tuple[Token, ...]  # emitted, in order: accepted drafts then the target's token
    rejected: tuple[Token, ...]  # draft tokens after the first rejection, shown as ghost text
    draft_s: float
    verify_s: float
    context_len: int  # tokens in context before this step
    k: int  # draft length asked of the drafter this step
    elapsed_s: float  # since the generation started
    inferred: bool = False  # a remote server's step: origins inferred from the chunk, drafted unknown
    # the answer's live speedup so far, its standard error, and the plain step's measured cost now
    # (decoding.speedup.SpeedupMeter); None until measured
    speedup: float | None = None
    speedup_err: float | None = None
    plain_step_s: float | None = None


@dataclass(frozen=True)
class Totals:
    new_tokens: int
    steps: int  # decode steps (target forwards after the prefill)
    target_forwards: int  # prefill + steps
    drafted: int
    accepted: int
    wall_s: float
    prefill_s: float
    draft_s: float
    verify_s: float
    accepted_lengths: tuple[int, ...] = ()  # per decode step: accepted draft tokens
    position_drafted: tuple[int, ...] = ()  # per draft position: times a token was proposed there
    position_accepted: tuple[int, ...] = ()  # ... and accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_length(self) -> float:
        """New tokens per target forward (1.0 for plain decoding)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def decode_s(self) -> float:
        """Wall time after the first token (the prefill's), i.e. spent producing the rest."""
        return max(0.0, self.wall_s - self.prefill_s)

    @property
    def tokens_per_s(self) -> float:
        """Generation speed after the first token: (new tokens - 1) / decode time, as chat apps show it;
        the prompt's processing time is reported separately (prefill_s, the time to first token). An answer of
        one token has no time after it: its one token over the time it took."""
        if self.new_tokens == 1 and self.wall_s > 0:
            return 1.0 / self.wall_s
        return decode_rate(self.new_tokens, self.decode_s)


def tokens_parts(totals: "Totals") -> list[str]:
    """["N tokens", "R tok/s"] as the summaries say them; the rate only where there is one (an answer stopped
    before its second token has none: never "0.0 tok/s")."""
    parts = [f"{totals.new_tokens} token{'' if totals.new_tokens == 1 else 's'}"]
    if totals.new_tokens > 1 and totals.decode_s > 0:
        parts.append(f"{totals.tokens_per_s:.1f} tok/s")
    return parts


def tokens_text(totals: "Totals") -> str:
    """The terminal's "N tokens, R tok/s" (`tokens_parts`)."""
    return ", ".join(tokens_parts(totals))


def tokens_per_step(totals: "Totals") -> float | None:
    """New tokens per target pass as the summaries give it (mean_accepted_length); None for an answer of at most
    one token: its token came with the prompt's pass, and a step that only ended it shows none (it read "0.50")."""
    return totals.mean_accepted_length if totals.new_tokens > 1 else None


def decode_rate(new_tokens: int, decode_s: float) -> float:
    return (new_tokens - 1) / decode_s if new_tokens > 1 and decode_s > 0 else 0.0


@dataclass(frozen=True)
class Finished:
    request_id: int
    reason: str  # "eos", "length" or "cancelled"
    text: str
    token_ids: tuple[int, ...]
    totals: Totals
    speedup: float | None = None  # the live speedup at the end (decoding.speedup.SpeedupMeter); None when unknown
    speedup_err: float | None = None  # its standard error; None with fewer than two plain samples
    # what a plain step cost during this answer: the mean of its own plain samples (the machine's speed while it
    # ran; Compare checks that its two runs ran at one); None where it took none
    plain_step_s: float | None = None
    plain_step_err: float | None = None  # its standard error; None with fewer than two samples


@dataclass(frozen=True)
class Failed:
    request_id: int
    message: str  # one line a user can act on
    kind: str = "error"  # the exception type name, for the GUI to pick an icon or hint


@dataclass(frozen=True)
class Loading:
    request_id: int
    message: str


@dataclass(frozen=True)
class Capabilities:
    """What a loaded backend offers. The window and the clients ask these, never the backend's name."""

    exact_colours: bool = True  # every token's origin comes from the engine (else inferred from stream chunks)
    strategies: bool = True  # the user picks the strategy and its draft length (else the server's own: "server")
    training: bool = True  # draft heads can be trained for the loaded model
    compare: bool = True  # Compare can run several strategies on the same prompt
    acceptance: str = "steps"  # where acceptance comes from: "steps" (each step's own) or "counters" (server-wide)
    precision: bool = True  # the device, dtype and weights shown are the engine's own (a server's are its business)


REMOTE = Capabilities(exact_colours=False, strategies=False, training=False, compare=False, acceptance="counters",
                      precision=False)


@dataclass(frozen=True)
class Loaded:
    request_id: int
    target: str
    draft: str | None
    device: str
    dtype: str
    context_window: int
    strategies: tuple[str, ...] = field(default_factory=tuple)
    baseline: BaselineCost | None = None  # measured plain decoding cost, for live speedup and plots
    backend: str = "local"  # or "remote": an OpenAI-compatible server
    notes: tuple[str, ...] = ()  # what a user should know about this backend's numbers
    warnings: tuple[str, ...] = ()  # what went wrong but did not stop the load (e.g. an unreadable head)
    weights: str = ""  # what the products run on, e.g. "Q4_1 (native)"; "" when it is `dtype`
    capabilities: Capabilities = field(default_factory=Capabilities)
    chat: bool = True  # the model has a chat template; else (a base model) messages continue as plain text
    path: str = ""  # one line where the model does not run Specula's own forward: the path it takes instead
    step: str = ""  # the decoding step answers start on now ("compiling": being built in the background); "" remote
    # a draft head the load was asked for (its source as asked) but left out, as it does not fit the model or could
    # not be read, and why in one line: the model loaded without it
    dropped_head: str = ""
    dropped_why: str = ""


@dataclass(frozen=True)
class BaselineCost:
    """Seconds per plain decoding step at context length L: a + b * L (see decoding.speedup.measure_baseline)."""

    a: float
    b: float

    def per_token(self, context_len: int) -> float:
        return self.a + self.b * context_len

    def expected(self, context_start: int, n_tokens: int) -> float:
        """Plain decoding time for n tokens produced at context lengths start .. start+n-1."""
        n = n_tokens
        return n * self.a + self.b * (n * context_start + n * (n - 1) / 2)

    def speedup(self, prompt_tokens: int, totals: Totals) -> float | None:
        """A finished generation's speedup: what plain decoding would have spent on the tokens after the
        first (the prefill's) / the time they took. None when nothing was decoded."""
        decoded = totals.new_tokens - 1
        if decoded <= 0 or totals.decode_s <= 0:
            return None
        return self.expected(prompt_tokens + 1, decoded) / totals.decode_s


@dataclass(frozen=True)
class ServerStats:
    """A remote server's speculative decoding counters since this request started (server-wide: other
    clients' requests running at the same time count too)."""

    request_id: int
    elapsed_s: float
    drafts: int  # steps with a draft
    draft_tokens: int
    accepted: int
    position_accepted: tuple[int, ...] = ()  # accepted at draft position 0, 1, ...

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None


Event = Started | Step | Finished | Failed | Loading | Loaded | ServerStats


@dataclass(frozen=True)
class Training:
    """Progress of a draft-head training run (TrainRequest)."""

    request_id: int
    message: str


@dataclass(frozen=True)
class Trained:
    """A draft head was trained and saved; a Loaded event with the new strategy list follows."""

    request_id: int
    kind: str
    folder: str
    accepted: float  # held-out mean accepted length
    summary: str
