"""The target's parts that a head's training and evaluation read and never change: its embedding, final norm
and LM head, in fp32 on the target's device."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...models.layers import embedding_scale, final_norm
from ...models.gguf import weight_rows


class Frozen:
    """The target's embedding, final norm and LM head in fp32, for training."""

    def __init__(self, target) -> None:
        model = target.model
        embed = model.get_input_embeddings()
        self.embed = weight_rows(embed, slice(None)).detach().float() * embedding_scale(embed)
        self.norm_w, self.eps = final_norm(model)
        self.lm = weight_rows(model.get_output_embeddings(), slice(None)).detach().float()
        self.device = self.embed.device  # where training runs: the target's device

    def logits(self, h: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over the whole vocabulary, or over the token ids `rows` only."""
        normed = self.norm_w * F.rms_norm(h, (h.shape[-1],), eps=self.eps)
        return F.linear(normed, self.lm if rows is None else self.lm[rows])
