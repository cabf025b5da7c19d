"""The engine's public types, without torch: what a client (the app, `specula serve`'s callers, the CLI)
builds and reads. The engine's modules import them from here (`serving/session.py` takes a `GenerateRequest`,
`decoding/loop.py` a `DecodeConfig`, ...), and so does the app, whose process never loads torch.

Events are in `events.py` (also torch-free), errors in `errors.py`, the strategy catalogue in
`strategies.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import SpeculaError
from .prompts import Message
from .strategies import default_k

BUNDLED = "bundled"
VERIFY_ROWS_MAX = 32  # the most rows a verify pass may hold and still round as single steps do (cpu/products.py)
K_MAX = VERIFY_ROWS_MAX - 1  # 31 draft tokens
# a seed: what torch's generators take (a negative seed is the same as the seed 2**64 above it); the one range the
# command line, the server, the app's settings and its Settings dialog hold a seed to
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):
            raise SpeculaError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpeculaError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SpeculaError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class DecodeConfig:
    k: int = 4  # draft length (the starting length when adaptive)
    adaptive_k: bool = False
    k_max: int = 16  # bound for adaptive k
    max_new_tokens: int = 256
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None  # None: a fresh random seed per request
    token_probs: bool = False  # greedy too: each draft token's probability (the app's hover; one softmax a step)
    # max_new_tokens was asked for (OpenAI's max_tokens): a prompt that leaves less room than that is refused,
    # as OpenAI and vLLM refuse it, instead of the answer being cut at the window's end
    fit_window: bool = False
    # the live speedup from this answer's own plain steps, not from recent answers' (Compare: each run says what
    # a plain step cost while it ran, so that a machine that slowed between the runs is seen)
    own_baseline: bool = False
    # whether the answer changes what the drafters keep: what they learn from the model's answers (the suffix corpus,
    # the phrases) and of how well they draft (Drafter.POLICY); not a Compare run, which re-creates an answer the
    # user already has and must measure it with the drafters as they were
    learn: bool = True
    # earlier answers (their text, or token ids) the drafters leave out of everything they learned, for this answer
    # only: Compare measures what the user's answer cost, so its runs draft from what was known before that answer,
    # never from the answer they re-create (decoding.drafter.Drafter.leaving_out)
    leave_out: tuple[str | tuple[int, ...], ...] = ()

    @classmethod
    def for_strategy(cls, strategy: str, k: int | None = None, *, temperature: float = 0.0, top_k: int = 0,
                     top_p: float = 1.0, **fields) -> "DecodeConfig":
        """How every entry point (the window, the command line, the server) makes a request's settings:
        k from the user, else the strategy's own draft length; the sampling settings as SamplingParams."""
        return cls(k=default_k(strategy) if k is None else k,
                   params=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p), **fields)

    def __post_init__(self) -> None:
        if not 1 <= self.k <= K_MAX:
            raise SpeculaError(f"draft length k must be between 1 and {K_MAX}, got {self.k}")
        if not 1 <= self.k_max <= K_MAX:
            raise SpeculaError(f"maximum draft length must be between 1 and {K_MAX}, got {self.k_max}")
        if self.max_new_tokens < 1:
            raise SpeculaError(f"max new tokens must be at least 1, got {self.max_new_tokens}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise SpeculaError(f"the seed must be a whole number from {SEED_MIN} to {SEED_MAX}, got {self.seed}")


@dataclass(frozen=True)
class ModelChoice:
    source: str = BUNDLED
    device: str = "auto"
    dtype: str = "auto"
    # How a GGUF's 4-bit weights run: "native" keeps its Q4_0/Q4_1/Q4_K blocks and runs them through int4
    # products (CPU, bf16), "dequantized" expands them to `dtype` as transformers reads them, "auto"
    # is native where it applies. Other sources are always dense.
    weights: str = "auto"
    # The decoding step: "compiled" (cpu/step.py: built once per machine, waited for), "auto" (used
    # once built; the build runs in the background), "eager" (never). CPU, Llama family.
    step: str = "auto"


@dataclass(frozen=True)
class LoadRequest:
    target: ModelChoice = field(default_factory=ModelChoice)
    draft: str | None = None  # a model source; loaded on the target's device and dtype
    measure_baseline: bool = True
    # a draft head: a folder (Specula's, or an EAGLE-1/2/3 or Medusa head as published) or a Hub id; it comes
    # first among the heads of its kind for this model
    draft_head: str | None = None
    # an answer as the first ones will ask (its strategy, options and settings; its messages are not read):
    # the drafter is made and a short answer run with it before the load says it is ready, so that the first
    # answer after a start runs at the speed of the next
    prepare: GenerateRequest | None = None
    # the target loaded now stays (is not read again) where it is the one `target` names: a load that changes only
    # the draft (the Models view's "Use as draft") reads only the draft
    keep_target: bool = False


@dataclass(frozen=True)
class RemoteLoadRequest:
    """Connect to a server (the remote counterpart of LoadRequest)."""

    server: str
    model: str = ""  # empty: the server's first model
    api_key_env: str = ""  # the environment variable holding the key; empty: the OS keyring, else none
    baseline_server: str = ""  # the same model served without speculation, for a measured speedup
    verify_tls: bool = True
    use_keyring: bool = True
    allow_http_key: bool = False  # the user allowed sending the key unencrypted to a host that is not this one
    api_key: str = field(default="", repr=False)  # the key itself (a caller's own), before api_key_env and the keyring


@dataclass(frozen=True)
class GenerateRequest:
    messages: tuple[Message, ...]
    strategy: str = "none"
    config: DecodeConfig = field(default_factory=DecodeConfig)
    chat: bool = True
    options: tuple[tuple[str, object], ...] = ()  # strategy options, e.g. (("max_n", 3),)

    @property
    def option_dict(self) -> dict:
        return dict(self.options)


@dataclass(frozen=True)
class TrainRequest:
    """Train a draft head for the loaded target on its own answers (see heads.train.run.run_training)."""

    kind: str = "eagle"
    tokens: int = 20000
    epochs: int = 3
    batch: int = 16  # small batches: a cancel takes effect within one batch
