"""`eagle`: a trained head drafts from the target's own features (EAGLE, Li et al. 2024), as a chain.

Before drafting, the head reads the target's final hidden states of the positions kept since it last
drafted (the runner keeps them with its cache), with the embeddings of the tokens that followed them;
that also predicts the hidden state of the next position. The target's final norm and LM head turn each
prediction into a draft token, which is fed back with the predicted state. Rollback: the head's cache is
truncated to the positions it read with the target's real features.
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
        module, _ = load_head(Path(head), target, kind="eagle")
        return cls(module, target, branch=bool(branch))

    def reset(self) -> None:
        self.head.truncate(0)
        self.synced = 0

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Draft:
        length = ctx.tokens.shape[0]
        out = self.read(ctx)
        if k <= 0 or out is None:
            return empty_draft()
        device = out.device
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

    def read(self, ctx: DraftContext) -> torch.Tensor | None:
        """Read the features of the positions kept since the last call; the head's prediction of the
        newest position's feature (D,), or None when the target keeps no features."""
        runner, length = ctx.target, ctx.tokens.shape[0]
        if not hasattr(runner, "features") or length - 1 > runner.length or self.synced >= length - 1:
            return None
        self.head.truncate(self.synced)
        feats = runner.features(self.synced, length - 1)
        tokens = ctx.tokens[self.synced + 1 : length].to(feats.device)
        out = self.head(feats[None], self.embed(tokens)[None], start=self.synced, use_cache=True)[0, -1]
        self.synced = length - 1
        return out

    def _logits(self, out: torch.Tensor) -> torch.Tensor:
        h = self.norm(out[None])
        if self.ids is None:
            return self.lm_head(h)[0].float()[: self.vocab]
        full = torch.full((self.vocab,), float("-inf"), device=h.device)
        full[self.ids] = torch.nn.functional.linear(h, self.sub_weight)[0].float()
        return full

    def observe(self, accepted: int, next_token: int) -> None:
        pass  # the next propose() re-reads the kept positions with the target's real features
