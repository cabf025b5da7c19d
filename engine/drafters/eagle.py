"""`eagle`: a trained head drafts from the target's own features (EAGLE, Li et al. 2024), as a chain.

After every target pass the head reads the target's final hidden states of the newly kept positions
(with the embeddings of the tokens that followed them), which also predicts the hidden state of the
next position; the target's final norm and LM head turn each prediction into a draft token, which is fed
back with the predicted state. Rollback: the head's cache is truncated to the positions it read with the
target's real features, and those are re-read after each pass.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import SpeculaError, UnsupportedModelError
from ..heads.eagle import load_head
from ..sampling import process_logits, sample
from .base import Draft, DraftContext, empty_draft


class Eagle:
    name = "eagle"
    description = "a trained head drafts from the target's own features (needs --head DIR from `specula train-head`)"

    def __init__(self, head, target) -> None:
        model = target.model
        self.head = head
        self.embed = model.get_input_embeddings()
        self.norm = model.model.norm
        self.lm_head = model.get_output_embeddings()
        self.vocab = self.lm_head.weight.shape[0]
        self.synced = 0  # positions the head has read with the target's real features
        self.broken = False

    @classmethod
    def build(cls, target, draft=None, head=None, **options) -> "Eagle":
        if not target.uses_lean_forward:
            raise UnsupportedModelError(
                f"eagle supports the Llama family (Llama, Qwen2/3, Mistral, SmolLM), not '{target.model.config.model_type}'"
            )
        if head is None:
            raise SpeculaError("strategy 'eagle' needs a trained draft head (--head DIR; make one with `specula train-head`)")
        module, _ = load_head(Path(head), target)
        return cls(module, target)

    def reset(self) -> None:
        self.head.truncate(0)
        self.synced = 0
        self.broken = False

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Draft:
        runner = ctx.target
        length = ctx.tokens.shape[0]
        hidden = getattr(runner, "hidden", None)
        if k <= 0 or self.broken or hidden is None:
            return empty_draft()
        first, last = self.synced - runner.hidden_start, length - 1 - runner.hidden_start  # rows to read
        if first < 0 or last > hidden.shape[0] or first >= last:
            self.broken = True  # a pass went by unseen: no features to draft from in this generation
            return empty_draft()
        device = hidden.device
        tokens = ctx.tokens[self.synced + 1 : length].to(device)
        self.head.truncate(self.synced)
        out = self.head(hidden[first:last][None], self.embed(tokens)[None], start=self.synced, use_cache=True)[0, -1]
        self.synced = length - 1
        drafted: list[int] = []
        qs: list[torch.Tensor] = []
        for j in range(k):
            logits = self.lm_head(self.norm(out[None]))[0].float()[: self.vocab]
            if ctx.params.greedy:
                token = int(logits.argmax())
            else:
                q = process_logits(logits, ctx.params)
                token = int(sample(q, ctx.generator))
                qs.append(q)
            drafted.append(token)
            if j + 1 < k:
                emb = self.embed(torch.tensor([token], device=device))
                out = self.head(out[None, None], emb[None], start=length - 1 + j, use_cache=True)[0, -1]
        return Draft(torch.tensor(drafted, dtype=torch.long), torch.stack(qs) if qs else None)

    def observe(self, accepted: int, next_token: int) -> None:
        pass  # the next propose() re-reads the kept positions with the target's real features
