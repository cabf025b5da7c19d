"""Drafting with a causal LM that has its own KV cache: a separate small model (`draft-model`) or the
target's own first layers (`layer-skip`). The cache is kept in step with the conversation by its
common prefix, so rollback after a rejection is a truncation and nothing is recomputed twice."""

from __future__ import annotations

import torch

from ..api.types import SamplingParams
from ..decoding.drafter import Draft, DraftContext, Drafter
from ..decoding.sampling import process_logits, sample
from ..decoding.target import ModelRunner


class ModelDrafter(Drafter):
    name = "model"

    def __init__(self, runner: ModelRunner, target_vocab: int) -> None:
        self.runner = runner
        self.target_vocab = target_vocab
        self.cached: list[int] = []  # the tokens whose keys and values the runner holds
        self._known = 0  # cached[:_known] is a prefix of every later context of this generation

    def reset(self) -> None:
        self.runner.truncate(0)
        self.cached = []
        self._known = 0

    def _sync(self, tokens: list[int]) -> torch.Tensor:
        """Roll the cache back to what it shares with `tokens`, feed the rest; logits (1, V) of the last."""
        limit = min(len(self.cached), len(tokens) - 1)  # the newest token is always fed for its logits
        common = min(self._known, limit)  # within one generation the context only grows
        while common < limit and self.cached[common] == tokens[common]:
            common += 1
        self.runner.truncate(common)
        self.cached = tokens[:]
        self._known = len(tokens)
        return self.runner.forward(torch.tensor(tokens[common:], dtype=torch.long))

    def _pick(self, logits: torch.Tensor, params: SamplingParams, gen) -> tuple[int, torch.Tensor | None]:
        logits = self._to_target_vocab(logits[-1])  # (V_target,)
        if params.greedy:
            return int(logits.argmax()), None
        q = process_logits(logits, params)
        return int(sample(q, gen)), q

    def _to_target_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        v = logits.shape[-1]
        if v > self.target_vocab:  # ids the target cannot produce
            return logits[: self.target_vocab]
        if v < self.target_vocab:  # padding rows the draft lacks get no mass
            pad = logits.new_full((self.target_vocab - v,), float("-inf"))
            return torch.cat([logits, pad])
        return logits

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        room = self.runner.max_len - ctx.tokens.shape[0]
        k = min(k, room)
        if k <= 0:
            return Draft(torch.empty(0, dtype=torch.long))
        logits = self._sync(ctx.tokens.tolist())
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for i in range(k):
            token, q = self._pick(logits, ctx.params, ctx.generator)
            drafted.append(token)
            if q is not None:
                qs.append(q)
            if i + 1 < k:
                logits = self.runner.forward(torch.tensor([token], dtype=torch.long))
                self.cached.append(token)
        q_all = torch.stack(qs) if qs else None  # (k, V)
        return Draft(torch.tensor(drafted, dtype=torch.long), q_all)

    def observe(self, accepted: int, next_token: int) -> None:
        pass  # the next propose() finds the common prefix and truncates there
