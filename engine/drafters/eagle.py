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

    def __init__(self, head, target, stop_below: float = 0.3, branch: bool = False) -> None:
        model = target.model
        self.head = head
        self.embed = model.get_input_embeddings()
        self.norm = model.model.norm
        self.lm_head = model.get_output_embeddings()
        self.vocab = self.lm_head.weight.shape[0]
        self.synced = 0  # positions the head has read with the target's real features
        self.broken = False
        ids = head.draft_ids
        self.ids = ids.to(self.lm_head.weight.device) if ids.numel() else None
        self.sub_weight = self.lm_head.weight[self.ids].contiguous() if self.ids is not None else None
        self.stop_below = stop_below  # greedy: no further draft token once the head's top guess is less likely
        self.branch = branch  # greedy: the runner-up as a sibling leaf when it is likely enough
        self.sibling_above = 0.2

    @classmethod
    def build(cls, target, draft=None, head=None, branch=None, **options) -> "Eagle":
        if not target.uses_lean_forward:
            raise UnsupportedModelError(
                f"eagle supports the Llama family (Llama, Qwen2/3, Mistral, SmolLM), not '{target.model.config.model_type}'"
            )
        if head is None:
            raise SpeculaError("strategy 'eagle' needs a trained draft head (--head DIR; make one with `specula train-head`)")
        module, _ = load_head(Path(head), target)
        return cls(module, target, branch=bool(branch))

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
        greedy = ctx.params.greedy
        drafted: list[int] = []
        parents: list[int] = []
        qs: list[torch.Tensor] = []
        chain = -1  # the index of the last chain token: the parent of the next level
        for j in range(k):
            logits = self._logits(out)  # (V,) fp32, -inf outside the draft vocabulary
            if greedy:
                probs = torch.softmax(logits, -1)
                top = probs.topk(2)
                if j > 0 and float(top.values[0]) < self.stop_below:
                    break  # an unlikely guess costs more verify time than it is expected to win
                token = int(top.indices[0])
                drafted.append(token)
                parents.append(chain)
                here = len(drafted) - 1
                if self.branch and float(top.values[1]) >= self.sibling_above:
                    drafted.append(int(top.indices[1]))  # a leaf beside the chain token
                    parents.append(chain)
                chain = here
            else:
                q = process_logits(logits, ctx.params)
                token = int(sample(q, ctx.generator))
                qs.append(q)
                drafted.append(token)
                parents.append(chain)
                chain = len(drafted) - 1
            if j + 1 < k:
                emb = self.embed(torch.tensor([token], device=device))
                out = self.head(out[None, None], emb[None], start=length - 1 + j, use_cache=True)[0, -1]
        tree = torch.tensor(parents) if greedy and len(parents) != len(set(parents)) else None
        return Draft(torch.tensor(drafted, dtype=torch.long), torch.stack(qs) if qs else None, tree)

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        h = self.norm(out[None])
        if self.ids is None:
            return self.lm_head(h)[0].float()[: self.vocab]
        full = torch.full((self.vocab,), float("-inf"), device=h.device)
        full[self.ids] = torch.nn.functional.linear(h, self.sub_weight)[0].float()
        return full

    def observe(self, accepted: int, next_token: int) -> None:
        pass  # the next propose() re-reads the kept positions with the target's real features
