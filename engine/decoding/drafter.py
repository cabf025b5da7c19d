"""The drafter interface: propose up to k tokens for the context, then hear what the target kept."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..api.strategies import STRATEGIES
from ..api.types import SamplingParams
from .length import DraftLength
from .tree import TokenTree


@dataclass(frozen=True)
class DraftContext:
    tokens: torch.Tensor  # (L,) int64 on the CPU: the whole conversation so far, last = newest token
    prompt_len: int
    params: SamplingParams
    generator: torch.Generator | None
    target: object | None = None  # the target's runner: its last pass's hidden states, for feature drafters
    # for drafters that choose their own lengths (chooses_length): the answer's live plain-step cost, and
    # whether timings may shape the steps (not when sampling with a seed: it must repeat its answer)
    plain_s: float | None = None
    timed: bool = True


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # (n,) int64, n <= k (n = 0: nothing to propose this step)
    q: torch.Tensor | None = None  # (n, V) drafter probabilities, or None for a point guess (one-hot)
    # a token tree instead of a chain: row 0 the newest context token, row i + 1 draft token i
    # (TokenTree.of_draft). Under sampling a tree's tokens count as point guesses (q is not used):
    # verify.walk_tree_sampling
    tree: TokenTree | None = None

    @property
    def parents(self) -> list[int] | None:
        """A tree's draft tokens' parents: -1 for the newest context token, else an earlier draft token's index."""
        return None if self.tree is None else [row - 1 for row in self.tree.parents[1:]]


class Drafter:
    """What every strategy is: `propose` drafts, `observe` hears what the target kept. The other hooks
    are declared here with what they do by default, and a strategy overrides the ones it needs:

    - `reset`: a new generation starts (default: nothing to forget); `finished(tokens, prompt_len)`: one
      ended, with the whole conversation (drafters that learn from the model's answers);
    - `observe_path(path)`: after a tree's pass, before observe(): the draft indices of the path the target kept
      (drafters that send trees and learn which of their branches were kept);
    - `observe_tree(best)`, for drafters that learn from every scored node (`learns_from_tree`, lookahead):
      before observe(), the target's argmax after each scored draft token (key: its index in Draft.tokens);
    - `observe_pass(rows, seconds)`: every step's verify pass, its rows and time (what a row costs here);
    - `observe_step(drafted, accepted, seconds)`, for drafters that choose each step's draft length
      themselves (`chooses_length`, auto): the step's counts and wall time after each step they proposed
      for. For the others the loop chooses the length with the drafter's `lengths(k)`
      (decoding.length.DraftLength), kept across generations as auto keeps its own: what a strategy
      measured in one answer (how often its drafts are kept, what its passes cost) holds in the next.

    `aux_layers`: the target layers whose entering hidden states the drafter reads (EAGLE-3 heads; the
    runner keeps them from the prompt on, `aux_features`).
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    learns_from_tree: ClassVar[bool] = False
    chooses_length: ClassVar[bool] = False
    # drafts only as far as it is confident, each token weighed against its cost (a draft model): auto asks it for
    # its whole length and leaves the rest to it
    sizes_itself: bool = False
    aux_layers: tuple[int, ...] = ()
    # what the drafter learns across answers of how well it drafts (its lengths' acceptance, its calibration): a run
    # that does not learn (DecodeConfig.learn, Compare's) leaves them as they were (`unchanged`)
    POLICY: ClassVar[tuple[str, ...]] = ("_lengths",)
    # seconds of the last proposal spent catching up: reading positions that a drafter proposing at every
    # step would have read on the steps before (after plain steps, or a new answer's prompt). The step's
    # time is booked without them, so one draft after many plain steps is not valued as every draft would be
    catch_up_s: float = 0.0
    _lengths: DraftLength | None = None

    def lengths(self, k: int) -> DraftLength:
        """The draft-length policy for drafts of at most k, kept from one generation to the next (a new
        one when k changes)."""
        if self._lengths is None or self._lengths.k != k:
            self._lengths = DraftLength(k)
        return self._lengths

    def reset(self) -> None:
        """Forget everything: a new generation starts."""

    def forget(self) -> None:
        """Drop what is kept of earlier conversations' positions (a drafting model's cache), so that the next
        answer reads its whole prompt, as the target then does (Session.forget)."""

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        """Up to k tokens (a chain, or a tree through Draft.tree) to continue ctx.tokens."""
        raise NotImplementedError

    def waiting(self, ctx: DraftContext) -> bool:
        """Whether it would rather not draft for this context yet (a drafting model that would first read a new
        answer's prompt): auto then leaves it out of the step's choice."""
        return False

    def observe(self, accepted: int, next_token: int) -> None:
        """The target kept `accepted` draft tokens, then produced `next_token`."""

    def passed(self, accepted: int) -> None:
        """A step this drafter did not propose for (another member of auto's did, or none) kept `accepted`
        draft tokens and the target's next: drafters that read every kept position learn which ones the next
        proposal would have read anyway, had it proposed for this step."""

    def observe_tree(self, best: dict[int, int]) -> None:
        """The target's argmax after each scored draft token (learns_from_tree drafters)."""

    def observe_path(self, path: list[int]) -> None:
        """After a tree's pass: the draft indices (into Draft.tokens) of the path the target kept, root side first."""

    def finished(self, tokens: torch.Tensor, prompt_len: int) -> None:
        """The answer ended (or was cancelled): the whole conversation, its prompt's `prompt_len` tokens
        then the answer (drafters that learn from the model's answers)."""

    @contextmanager
    def unchanged(self) -> Iterator[None]:
        """For a `with` block (one answer): what the drafter learns of how well it drafts (POLICY) comes back as it
        was after it, so that an answer run to measure (Compare's) changes nothing the next answers draft with."""
        saved = {name: copy.deepcopy(getattr(self, name, None)) for name in self.POLICY}
        try:
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    def leaving_out(self, answers: list[list[int]]) -> AbstractContextManager:
        """For a `with` block (one answer): what the drafter learned from earlier answers, as if `answers` (token
        ids) had never been learned (drafters that learn from the model's answers; DecodeConfig.leave_out)."""
        return nullcontext()

    def observe_step(self, drafted: int, accepted: int, seconds: float) -> None:
        """A step this drafter proposed for: its counts and wall time (chooses_length drafters)."""

    def observe_pass(self, rows: int, seconds: float) -> None:
        """Every step's verify pass (a plain step's too): its rows (the newest token and the draft's) and its
        time, for drafters that weigh a draft token against what its row costs (PassCosts)."""

    @property
    def chose(self) -> str | None:
        """For a strategy that chooses among drafters (auto): which one drafted this step, in words."""
        return None


def empty_draft() -> Draft:
    return Draft(torch.empty(0, dtype=torch.long))


class NoDraft(Drafter):
    """Strategy `none`: drafts nothing, so every step is one plain decoding step of the target (the baseline,
    and plain decoding wherever a caller gives no drafter)."""

    name = "none"
    chooses_length = True  # it drafts nothing: no length to choose
    description = STRATEGIES[name].description

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return empty_draft()


def sends_tree(force: bool | None, runner) -> bool:
    """Whether a drafter of fixed trees (medusa, lookahead) sends a tree this step: as forced by its `tree`
    option, else only where the target's tree passes decide as a chain pass would (runner.exact_trees) and a
    pass's extra rows cost next to nothing (not on a CPU, where each costs about a tenth of a plain step and
    a fixed tree of 10 nodes costs more than it wins; eagle sizes its trees by measured costs instead)."""
    if force is not None:
        return force
    return runner is not None and runner.exact_trees and runner.device.type != "cpu"


def running(figure: float | None, value: float, weight: float) -> float:
    """A running mean: `value` where there is no figure yet, else the figure moved `weight` of the way to it."""
    return value if figure is None else (1 - weight) * figure + weight * value


class PassCosts:
    """What a verify pass costs by its rows, from the passes seen: a line fitted to their times, older passes
    fading by FORGET each. `row_s`: what one more row adds (about a tenth of a step with AVX-512 at 1.5B, a
    quarter or more on AVX2 CPUs); `plain_s`: a pass of one row."""

    FORGET = 0.98

    def __init__(self) -> None:
        self.n = self.x = self.y = self.xx = self.xy = 0.0
        self.spread = False  # passes of more than one size seen

    def add(self, rows: int, seconds: float) -> None:
        f = self.FORGET
        self.n, self.x, self.y = f * self.n + 1, f * self.x + rows, f * self.y + seconds
        self.xx, self.xy = f * self.xx + rows * rows, f * self.xy + rows * seconds
        self.spread = self.spread or rows != 1

    def row_s(self) -> float | None:
        """Seconds one more row adds (None until passes of two sizes were seen)."""
        var = self.n * self.xx - self.x * self.x
        if not self.spread or var <= 1e-9 * max(1.0, self.n * self.xx):
            return None
        return max(0.0, (self.n * self.xy - self.x * self.y) / var)

    def plain_s(self) -> float | None:
        """Seconds of a pass of one row, on the fitted line."""
        if self.n == 0:
            return None
        slope = self.row_s() or 0.0
        return max(1e-6, (self.y - slope * self.x) / self.n + slope)
