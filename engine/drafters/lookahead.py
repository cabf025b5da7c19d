"""`lookahead`: Jacobi iteration on a window of guesses, and a pool of n-grams collected from it
(after Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead Decoding").

Each step proposes one token tree to the target:
- the pool's newest n-grams that start with the newest context token (verification branches), and
- the window: W guesses for the positions after the newest token, as one chain (the lookahead branch).

The target's pass scores both. Its argmax after window slot j is a better guess for the position after
slot j (one Jacobi iteration), so the window moves on to those outputs. Following one slot through
successive iterations gives a chain in which every token is the target's prediction after the one before:
the last N tokens of such a diagonal become an n-gram in the pool. N-grams of the conversation itself
go to the pool too. The window's own chain is also verified, so a converged window is accepted directly.

Where the target's tree passes are not bit-exact (bf16 on a CPU), one chain goes instead: the newest
pool n-gram, or else the window (`tree` option: always the tree).

This version keeps one window level (the n-grams come from the window's history, not from extra levels
in the pass) and keys the pool by one token. Under sampling the same tree is verified by recursive
rejection over siblings (verify.walk_tree_sampling), which keeps the target's distribution exactly.
"""

from __future__ import annotations

import random

import torch

from ..api.errors import SpeculaError
from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft, sends_tree
from ..decoding.tree import TokenTree, graft

POOL_PER_KEY = 8  # n-grams kept per first token, newest last


class Lookahead(Drafter):
    name = "lookahead"
    learns_from_tree = True  # observe_tree: every scored node's argmax feeds its n-gram pool
    description = STRATEGIES[name].description

    def __init__(self, window: int = 5, ngram: int = 4, guesses: int = 3, seed: int = 0,
                 force_tree: bool | None = None) -> None:
        if window < 1 or ngram < 2 or guesses < 0:
            raise SpeculaError(f"lookahead needs window >= 1, n-gram size >= 2 and guesses >= 0, got {window}, {ngram}, {guesses}")
        self.W, self.N, self.G, self.seed = window, ngram, guesses, seed
        self.force_tree = force_tree  # None: a tree where the target decides trees exactly
        self.reset()

    @classmethod
    def build(cls, target, draft=None, window=None, ngram=None, guesses=None, tree=None, **options) -> "Lookahead":
        return cls(window or 5, ngram or 4, 3 if guesses is None else guesses,
                   force_tree=None if tree is None else bool(tree))

    def reset(self) -> None:
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.window: list[int] = []  # guesses for the positions after the newest context token
        self.history: list[list[int]] = []  # per window slot: the earlier tokens on its diagonal
        self.slots: list[int | None] = []  # the draft index of each window slot in the last proposal
        self.outs: list[int | None] | None = None  # the target's argmax after each window slot
        self.seen = 0  # context positions already turned into pool n-grams
        self.rng = random.Random(self.seed)

    def _remember(self, gram: tuple[int, ...]) -> None:
        grams = self.pool.setdefault(gram[0], [])
        rest = gram[1:]
        if rest in grams:
            grams.remove(rest)
        grams.append(rest)
        if len(grams) > POOL_PER_KEY:
            del grams[0]

    def _add_context(self, tokens: list[int]) -> None:
        n = self.N
        for i in range(max(0, self.seen - n + 1), len(tokens) - n + 1):
            self._remember(tuple(tokens[i : i + n]))
        self.seen = len(tokens)

    def _fill(self, tokens: list[int]) -> None:
        """Start empty window slots with tokens drawn from the conversation (as lookahead decoding does)."""
        while len(self.window) < self.W:
            self.window.append(tokens[self.rng.randrange(len(tokens))])
            self.history.append([])

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        tokens = ctx.tokens.tolist()
        self._add_context(tokens)
        self._fill(tokens)
        self.outs, self.slots = None, []
        if k <= 0:
            return empty_draft()
        grams = [list(g[:k]) for g in reversed(self.pool.get(tokens[-1], [])[-self.G :])] if self.G else []
        runner = ctx.target
        if not sends_tree(self.force_tree, runner):
            # one chain: the newest pool n-gram, else the window (whose outputs still drive the Jacobi step)
            if grams:
                return Draft(torch.tensor(grams[0], dtype=torch.long))
            self.slots = list(range(min(k, len(self.window))))
            return Draft(torch.tensor(self.window[:k], dtype=torch.long))
        drafted: list[int] = []
        parents: list[int] = []
        for g in grams:  # branches share prefixes
            graft(drafted, parents, g)
        self.slots = graft(drafted, parents, self.window[:k])
        return Draft(torch.tensor(drafted, dtype=torch.long), tree=TokenTree.of_draft(parents))

    def observe_tree(self, best: dict[int, int]) -> None:
        """The target's argmax after each scored draft node (key: draft index)."""
        self.outs = [best.get(i) for i in self.slots]

    def observe(self, accepted: int, next_token: int) -> None:
        """Jacobi step: the root moved accepted + 1 positions on; slot j's output guesses the position
        after slot j, which is slot j - accepted of the new window."""
        outs, self.outs = self.outs or [], None
        size = len(self.window)
        for j, out in enumerate(outs):
            if out is not None and len(self.history[j]) >= self.N - 2:
                self._remember(tuple(self.history[j][len(self.history[j]) - (self.N - 2) :] + [self.window[j], out]))
        window, history = [], []
        for j in range(accepted, size):
            out = outs[j] if j < len(outs) else None
            if out is not None:
                window.append(out)
                history.append((self.history[j] + [self.window[j]])[-(self.N - 2) :] if self.N > 2 else [])
            elif j + 1 < size:  # not scored (pruned): the old guess one slot further on
                window.append(self.window[j + 1])
                history.append(self.history[j + 1])
        self.window, self.history = window, history
