"""Drafting with a causal LM that has its own KV cache: a separate small model (`draft-model`) or the
target's own first layers (`layer-skip`). The cache is kept in step with the conversation by its
common prefix, so rollback after a rejection is a truncation and nothing is recomputed twice.

A draft token costs a whole forward of the drafting model (the 0.5B Qwen2.5 drafting for the 1.5B: 0.43 of
the target's step), so the drafter drafts only what it is confident of. Each token's probability under the
drafter is turned into the share of such tokens the target kept (`Calibration`, learned from what it kept);
the chain's chance of surviving is the product of its tokens' shares. The drafter

- stops before the forward of the next token when the chain's chance times the share kept after a kept token
  is below that forward's cost plus a verify row's, both in plain steps (the forward's time measured, the
  plain step's from the answer, a row's from the target's passes: `PassCosts`): a token worth less than it
  costs is not drafted (EAGLE-2's dynamic length, llama.cpp's p-min with its threshold learned from the costs
  instead of set);
- leaves out a token it already has when the chain's chance of reaching and keeping it is below a verify
  row's cost;
- adds its next choices at a position as leaves beside the chain's token there (greedy steps, where the target's
  tree passes decide as a chain pass would): the chance that the chain reaches the position and the target takes
  the next choice in place of the first (`Calibration` again, learned from the positions where the first choice
  was rejected) against a verify row's cost. Each such leaf wins a token where it is kept and costs no forward of
  the drafter, so where rows are cheap (AVX-512: a tenth of a step) the pass carries them and where rows are dear
  (AVX2: a quarter) it stays a chain (SpecInfer's and EAGLE-2's trees grow the same way, by each node's chance);
- waits before it reads a new prompt until the answer is likely to win the read back (`waiting`): the read
  costs a third of the target's, which a short answer never wins back; and reads the latest READ_WINDOW
  positions only where more than READ_MOST are new (a long prompt, many steps of another drafter).

Sampling with a seed, timings must not shape the answer: the drafter then drafts its full length.
"""

from __future__ import annotations

import bisect
import time

import torch

from ..api.types import SamplingParams
from ..decoding.drafter import Draft, DraftContext, Drafter, PassCosts, running
from ..decoding.sampling import process_logits, sample
from ..decoding.target import ModelRunner
from ..decoding.tree import TokenTree

# before they are measured: a verify pass's extra row, in plain steps (a pass of 8 rows costs 1.34 steps at 1.5B
# with AVX-512, 2.3-2.6 with AVX2 only)
ROW_COST = 0.05
TOKEN_COST = 0.45  # a draft token's forward, in plain steps, until one is measured (the 0.5B for the 1.5B: 0.43)
RUNNING_WEIGHT = 0.1  # of the newest time in the running figures of a forward and of a read's position
AFTER_KEPT_WEIGHT = 0.05  # of the newest token in the share kept after a kept token
# a read of more than READ_MOST positions (a long prompt) reads the latest READ_WINDOW only
READ_MOST = 256
READ_WINDOW = 128
# a read of more than BIG_READ positions waits until the answer is likely to win it back: a position's read costs
# READ_COST of a plain step until measured (the 0.5B reading for the 1.5B: 0.11 on AVX2), a drafted answer's token
# wins GAIN of one (draft-model's 1.16-1.37x on the real pair: 0.14-0.27)
BIG_READ = 16
READ_COST = 0.1
READ_PROBE = 32  # positions of the read a draft model times when it is made (time_read)
GAIN = 0.2
SIBLINGS = 2  # next choices at a position that may join its chain token as leaves of the pass's tree
# the next choices' calibration bins: finer below, where most of them are
NEXT_EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85)


class Calibration:
    """The share of draft tokens the target kept, by the probability the drafter gave them (bins with EDGES
    between them). Each bin starts from the drafter's own probability (PRIOR drafts' worth at the bin's
    middle): a sibling model of the target is roughly calibrated before anything is measured. Counts fade by
    FORGET a draft, so the figures follow the conversation."""

    EDGES = (0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.96, 0.985, 0.995)
    PRIOR = 4.0
    FORGET = 0.995

    def __init__(self, edges: tuple[float, ...] | None = None) -> None:
        self.edges = edges or self.EDGES
        bounds = (0.0, *self.edges, 1.0)
        middles = [(lo + hi) / 2 for lo, hi in zip(bounds, bounds[1:])]
        self.reached = [self.PRIOR] * len(middles)  # tokens of the bin whose earlier tokens were all kept
        self.kept = [self.PRIOR * m for m in middles]  # ... and that were kept

    def share(self, p: float) -> float:
        """The share kept of draft tokens given probability p whose earlier tokens were kept."""
        i = bisect.bisect_right(self.edges, p)
        return self.kept[i] / self.reached[i]

    def observe(self, probs: list[float], accepted: int) -> None:
        """A draft whose tokens had probabilities `probs`, of which the first `accepted` were kept: the tokens
        up to the first rejected one count (the target judged nothing after it)."""
        self.judged([(p, i < accepted) for i, p in enumerate(probs[: accepted + 1])])

    def judged(self, judged: list[tuple[float, bool]]) -> None:
        """Tokens judged one by one: each its probability and whether the target took it."""
        if not judged:
            return
        self.reached = [self.FORGET * r for r in self.reached]
        self.kept = [self.FORGET * c for c in self.kept]
        for p, kept in judged:
            b = bisect.bisect_right(self.edges, p)
            self.reached[b] += 1
            self.kept[b] += kept


class ModelDrafter(Drafter):
    name = "model"
    POLICY = ("_lengths", "calibration", "after_kept", "next_choices")

    def __init__(self, runner: ModelRunner, target_vocab: int, confident: bool = True, tree: bool = True) -> None:
        self.runner = runner
        self.target_vocab = target_vocab
        self.cached: list[int] = []  # the tokens whose keys and values the runner holds
        self._known = 0  # the conversation's first _known tokens are a prefix of every later context of this answer
        self.offset = 0  # the conversation's position of the cache's first (a read of its latest positions only)
        # drafts only what pays (the module's note); false: always the full length asked for
        self.confident = confident
        self.tree = tree  # its next choices as leaves where they pay (false: chains only)
        self.calibration = Calibration()
        self.token_s: float | None = None  # a draft token's forward, running mean of measured ones
        self.after_kept = 0.7  # share kept of the tokens after a kept one (running), to value the next forward
        self._probs: list[float] = []  # the last draft's chain tokens' probabilities under the drafter
        # the share of next choices the target took where it rejected the first, by the drafter's probability of
        # the next choice given that the first is not the token (q / (1 - q of the first))
        self.next_choices = Calibration(NEXT_EDGES)
        self._leaves: list[tuple[int, float]] = []  # the last draft's leaves: (depth index, that probability)
        self._path: list[int] | None = None  # the draft indices of the path the target kept (a tree's)
        self.passes = PassCosts()  # what the target's verify passes cost by their rows, here
        self.read_s: float | None = None  # a position of a long read (running mean of measured ones)

    @property
    def sizes_itself(self) -> bool:
        return self.confident

    def reset(self) -> None:
        """A new answer: the cache keeps what it shares with the new conversation (a chat's next turn holds the
        last one), found at the first proposal."""
        self._known = 0
        self._probs, self._leaves, self._path = [], [], None

    def forget(self) -> None:
        self.runner.truncate(0)
        self.cached = []
        self._known = 0
        self.offset = 0

    def _common(self, view: list[int]) -> int:
        """How many of `view`'s first tokens the cache holds (never the newest: it is fed for its logits)."""
        limit = min(len(self.cached), len(view) - 1)
        common = min(max(0, self._known - self.offset), limit)  # within one answer the context only grows
        while common < limit and self.cached[common] == view[common]:
            common += 1
        return common

    def _read(self, tokens: list[int]) -> tuple[int, int]:
        """(offset, common): where the cache starts in the conversation `tokens` after the next read, and how
        many of its positions it keeps; the read is the rest. A window's cache (offset > 0) is not reused across
        answers, and a read of more than READ_MOST positions reads the latest READ_WINDOW only, into a fresh
        cache: a drafter guesses from what was said last."""
        offset = 0 if self._known == 0 else self.offset
        common = self._common(tokens[offset:]) if offset == self.offset else 0
        if len(tokens) - offset - common > READ_MOST:
            return len(tokens) - READ_WINDOW, 0
        return offset, common

    def time_read(self, positions: int = READ_PROBE) -> None:
        """Time a read of `positions` positions (twice: the first warms up) as what a position of a read costs, so
        that the first answer's wait for a read (`_waits`) weighs this machine's cost rather than READ_COST (on
        Zen 4 the 0.5B reads a position in 0.05 of the 1.5B's step, half of it: it waited 55 tokens into a
        128-token coding answer, where it keeps 2-3 tokens a pass)."""
        ids = torch.zeros(positions, dtype=torch.long)
        times = []
        for _ in range(2):
            self.runner.truncate(0)
            began = time.perf_counter()
            self.runner.forward(ids)
            times.append(time.perf_counter() - began)
        self.forget()
        self.read_s = min(times) / positions

    def waiting(self, ctx: DraftContext) -> bool:
        tokens = ctx.tokens.tolist()
        return self._waits(ctx, len(tokens) - sum(self._read(tokens)))

    def _waits(self, ctx: DraftContext, to_read: int) -> bool:
        """Whether drafting now would first read more of the conversation (more than BIG_READ positions: a new
        answer's prompt, where the cache holds little of it) than the answer is likely to win back: an answer that
        has gone n tokens is taken to go about n more, each won back at GAIN of a plain step, against the read's
        positions at their measured cost (READ_COST of a plain step each until one is measured, and at most). A short
        answer never pays a read of its prompt; a long one soon has it back."""
        if to_read <= BIG_READ:
            return False
        plain = ctx.plain_s or self.passes.plain_s()
        # at most READ_COST: a read timed while something else ran (servers warming up side by side) would keep the
        # drafter waiting for good, since only a read taken corrects it
        per_position = min(READ_COST, self.read_s / plain) if self.read_s and plain else READ_COST
        return to_read * per_position > (ctx.tokens.shape[0] - ctx.prompt_len) * GAIN

    def _sync(self, tokens: list[int], read: tuple[int, int]) -> torch.Tensor:
        """Roll the cache back to what it keeps of `tokens` (`read`: _read's), feed the rest; logits (1, V) of
        the last."""
        self.offset, common = read
        view = tokens[self.offset :]
        self.runner.truncate(common)
        self.cached = view[:]
        self._known = len(tokens)
        fed = len(view) - common
        began = time.perf_counter()
        logits = self.runner.forward(torch.tensor(view[common:], dtype=torch.long))
        # more than the two tokens a drafter drafting at every step feeds (its last draft token and the
        # target's next): positions caught up on, after plain steps or another drafter's
        seconds = time.perf_counter() - began
        self.catch_up_s = max(0.0, seconds - (self.token_s or 0.0)) if fed > 2 else 0.0
        if fed > BIG_READ:  # what a position of a read costs (waiting)
            self.read_s = running(self.read_s, seconds / fed, RUNNING_WEIGHT)
        return logits

    def _pick(self, logits: torch.Tensor, params: SamplingParams, gen,
              choices: int = 1) -> tuple[int, torch.Tensor | None, float, list[tuple[int, float]]]:
        """(token, its processed distribution over the target's vocabulary or None when greedy, the
        drafter's probability of it, and greedy's next `choices - 1` choices with their probabilities)."""
        logits = logits[-1]
        if params.greedy:
            top = torch.softmax(logits, -1).topk(choices)
            (token, *others), (p, *ps) = top.indices.tolist(), top.values.tolist()
            return token, None, p, list(zip(others, ps))
        q = process_logits(self._to_target_vocab(logits), params)
        token = int(sample(q, gen))
        return token, q, float(q[token]), []

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        if v > self.target_vocab:  # ids the target cannot produce
            return logits[: self.target_vocab]
        if v < self.target_vocab:  # padding rows the draft lacks (or ids it leaves out) get no mass
            pad = logits.new_full((self.target_vocab - v,), float("-inf"))
            return torch.cat([logits, pad])
        return logits

    def _forward_one(self, token: int) -> torch.Tensor:
        began = time.perf_counter()
        logits = self.runner.forward(torch.tensor([token], dtype=torch.long))
        self.token_s = running(self.token_s, time.perf_counter() - began, RUNNING_WEIGHT)
        return logits

    def observe_pass(self, rows: int, seconds: float) -> None:
        self.passes.add(rows, seconds)

    def costs(self, plain_s: float | None) -> tuple[float, float]:
        """(a draft token's forward, a verify pass's extra row), in plain steps: as measured here, where they
        are (TOKEN_COST and ROW_COST until then)."""
        plain = plain_s or self.passes.plain_s()
        row_s = self.passes.row_s()
        row = row_s / plain if row_s is not None and plain else ROW_COST
        return (self.token_s / plain if self.token_s and plain else TOKEN_COST), row

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        room = self.runner.max_len - ctx.tokens.shape[0]
        k = min(k, room)
        self._probs, self._leaves, self._path = [], [], None
        self.catch_up_s = 0.0
        if k <= 0:
            return Draft(torch.empty(0, dtype=torch.long))
        choosing = self.confident and ctx.timed
        tokens = ctx.tokens.tolist()
        read = self._read(tokens)
        if choosing and self._waits(ctx, len(tokens) - sum(read)):
            return Draft(torch.empty(0, dtype=torch.long))
        logits = self._sync(tokens, read)
        token_cost, row_cost = self.costs(ctx.plain_s)
        forward_cost = token_cost + row_cost  # what drafting one more token costs
        # next choices as leaves: greedy steps whose tree passes decide as chains do (a tree's tokens are point
        # guesses under sampling, where the chain's carry the drafter's distribution)
        exact = getattr(ctx.target, "exact_trees", False)
        choices = 1 + SIBLINGS if self.tree and choosing and ctx.params.greedy and exact else 1
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        leaves: list[tuple[int, int]] = []  # (depth index, token)
        chance = 1.0  # that the target keeps every token drafted so far
        for i in range(k):
            token, q, p, others = self._pick(logits, ctx.params, ctx.generator, choices)
            share = self.calibration.share(p)
            if choosing and i and chance * share < row_cost:
                break  # not worth even a verify row
            for other, p_other in others:  # reached, the first choice rejected, and the target's is this one
                given = p_other / max(1e-9, 1 - p)
                if chance * (1 - share) * self.next_choices.share(given) > row_cost:
                    leaves.append((i, other))
                    self._leaves.append((i, given))
            drafted.append(token)
            self._probs.append(p)
            chance *= share
            if q is not None:
                qs.append(q)
            if i + 1 >= k or (choosing and chance * self.after_kept < forward_cost):
                break
            logits = self._forward_one(token)
            self.cached.append(token)
        q_all = torch.stack(qs) if qs else None  # (n, V)
        if not leaves:
            return Draft(torch.tensor(drafted, dtype=torch.long), q_all)
        # the chain first (each position's first choice is its first child), then the leaves beside it
        parents = [*range(-1, len(drafted) - 1), *(i - 1 for i, _ in leaves)]
        return Draft(torch.tensor(drafted + [t for _, t in leaves], dtype=torch.long),
                     tree=TokenTree.of_draft(parents))

    def observe_path(self, path: list[int]) -> None:
        self._path = path

    def observe(self, accepted: int, next_token: int) -> None:
        # the next propose() finds the common prefix and truncates there; what was kept teaches the calibration
        probs = self._probs
        chain = len(probs)
        path = self._path if self._path is not None else list(range(accepted))
        kept = 0  # the chain's tokens kept: the path's first ones (a leaf, or another drafter's node, may follow)
        while kept < min(chain, len(path)) and path[kept] == kept:
            kept += 1
        self.calibration.observe(probs, kept)
        for i in range(1, min(chain, kept + 1)):  # tokens after a kept one: each kept or not
            self.after_kept = running(self.after_kept, float(i < kept), AFTER_KEPT_WEIGHT)
        if kept < chain:  # where the chain's token was rejected, its leaves were judged
            taken = set(path)
            self.next_choices.judged([(given, chain + j in taken) for j, (depth, given) in enumerate(self._leaves)
                                      if depth == kept])
        self._probs, self._leaves, self._path = [], [], None
