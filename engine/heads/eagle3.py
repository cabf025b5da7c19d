"""An EAGLE-3 draft head (Li et al. 2025): one decoder layer that reads the hidden states entering a low, a
middle and a high layer of the target (side by side, projected to one by `fc`) with the embedding of the
next token, and predicts the token after it through its own final norm and LM head over a reduced
vocabulary (`draft_ids`: the target's ids of its rows). Drafting feeds the layer's output back in place of
the target's states, so training unrolls it the same way ("training-time test", `unrolled`).

Specula's own EAGLE-3 heads are stored like its EAGLE heads (kind "eagle", `HeadConfig.aux_layers` set) and
use the target's embedding; published EAGLE-3 checkpoints load through `published.py` into this module, with
the variants the speculators library trains (`Variant`): an RMS norm over the target's states before `fc`
(over all of them, or over each layer's), the normed stream as the layer's residual, and the final norm's
output as what a draft step feeds back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import HeadConfig
from .eagle import EagleHead, _rotate


def default_aux_layers(target_layers: int) -> tuple[int, ...]:
    """The target layers an EAGLE-3 head reads by default (by the hidden states entering them): a low, a
    middle and a high one, as EAGLE-3's and SpecForge's training picks them."""
    return tuple(sorted({min(2, target_layers - 1), target_layers // 2, max(0, target_layers - 3)}))


@dataclass(frozen=True)
class Variant:
    """How a published EAGLE-3 head departs from EAGLE-3's own formula (the speculators library's flags).
    aux_norm: an RMS norm over the target's states before fc, over all of them side by side ("whole",
    `norm_before_fc`) or over each layer's ("each", `fc_norm`); normed_residual: the layer's residual stream is
    hidden_norm(h) instead of h (`norm_before_residual`); normed_output: a draft step feeds back the final
    norm's output instead of the layer's (`norm_output`); qk_norm: RMS norms over each head's queries and keys
    before rotary (a Qwen3 layer, the library's draft layer for Qwen3 targets)."""

    aux_norm: str | None = None
    normed_residual: bool = False
    normed_output: bool = False
    qk_norm: bool = False


class Eagle3Head(EagleHead):
    """fc (len(aux_layers) x the target's hidden size -> H) over the target layers' states; the layer's
    attention reads [input_norm(embedding), hidden_norm(h)] (2H) and its residual stream is h; its own
    final norm and LM head give logits over the draft vocabulary (`variant`: a published head's departures)."""

    own_lm_head = True  # draft_logits: its final norm and LM head over the draft vocabulary

    def __init__(self, config: HeadConfig, vocab: int | None = None, variant: Variant = Variant()) -> None:
        super().__init__(config)
        c = config
        if not c.aux_layers or not c.draft_vocab:
            raise ValueError("an EAGLE-3 head needs the target layers it reads and its draft vocabulary size")
        del self.feature_norm, self.embed_norm, self.attn_norm
        self.fc = nn.Linear(len(c.aux_layers) * (c.target_hidden or c.hidden), c.hidden, bias=False)
        self.hidden_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.input_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.q = nn.Linear(2 * c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(2 * c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.final_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.lm = nn.Linear(c.hidden, c.draft_vocab, bias=False)
        self.embed = nn.Embedding(vocab, c.hidden) if vocab is not None else None  # a published file's own copy
        self.aux_layers = tuple(c.aux_layers)
        self.variant = variant
        wide = c.target_hidden or c.hidden
        if variant.aux_norm == "whole":
            self.aux_norm = nn.RMSNorm(len(c.aux_layers) * wide, eps=c.eps)
        elif variant.aux_norm == "each":
            self.aux_norms = nn.ModuleList(nn.RMSNorm(wide, eps=c.eps) for _ in c.aux_layers)
        elif variant.aux_norm is not None:
            raise ValueError(f"an EAGLE-3 head's norm before fc is 'whole' or 'each', not {variant.aux_norm!r}")
        if variant.qk_norm:
            self.q_norm = nn.RMSNorm(c.head_dim, eps=c.eps)
            self.k_norm = nn.RMSNorm(c.head_dim, eps=c.eps)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's layers' states (read) through fc, or the head's own output (fed back, already H wide)."""
        if features.shape[-1] == self.config.hidden:
            return features
        if self.variant.aux_norm == "whole":
            features = self.aux_norm(features)
        elif self.variant.aux_norm == "each":
            parts = features.chunk(len(self.aux_norms), dim=-1)
            features = torch.cat([norm(part) for norm, part in zip(self.aux_norms, parts)], dim=-1)
        return self.fc(features)

    def inputs(self, features: torch.Tensor, next_embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.project(features)
        normed = self.hidden_norm(h)
        return (normed if self.variant.normed_residual else h), torch.cat((self.input_norm(next_embeds), normed), dim=-1)

    def native_inputs(self, features: torch.Tensor, next_embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.project(features), next_embeds

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, start: int = 0,
                use_cache: bool = False) -> torch.Tensor:
        return self._output(super().forward(features, next_embeds, start, use_cache))

    def forward_tree(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor, slot: int,
                     visible: torch.Tensor) -> torch.Tensor:
        return self._output(super().forward_tree(features, next_embeds, positions, slot, visible))

    def _output(self, out: torch.Tensor) -> torch.Tensor:
        """What a draft step feeds back and the logits read: the final norm's output where the variant says so
        (its logits then skip the norm), else the layer's."""
        return self._final_norm(out) if self.variant.normed_output else out

    def _final_norm(self, outs: torch.Tensor) -> torch.Tensor:
        return self.final_norm(outs) if self.native is None else self.native.norm(outs, self.final_norm)

    def draft_logits(self, outs: torch.Tensor) -> torch.Tensor:
        """(n, H) outputs -> (n, draft vocabulary) fp32 logits."""
        return self.lm(outs if self.variant.normed_output else self._final_norm(outs)).float()

    def unrolled(self, aux: torch.Tensor, next_embeds: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test: aux (B, T, len(aux_layers) * D), the embeddings of the tokens after each
        position (B, T, D) -> the layer's outputs (B, T, H) at each of `steps` unrolled steps. Step 0 reads
        the target's states; at step k row i reads step k-1's output at row i-1 (as a draft k deep does), and
        attends to the target-read keys up to position i-k and to its own chain's keys of steps 1..k (the
        drafts before it), at position i. Row i of step k is meaningful from i >= k (its chain starts at a
        real position); earlier rows are computed and should be left out of the loss."""
        c = self.config
        b, t, _ = aux.shape
        groups = c.heads // c.kv_heads
        pos = torch.arange(t, device=aux.device)
        cos, sin = self._rope(pos, aux.dtype)
        h = self.fc(aux)
        keys, values, outs = [], [], []
        for k in range(steps):
            if k:  # the previous step's output one position back (row 0: a placeholder, never in the loss)
                h = torch.cat((h.new_zeros(b, 1, h.shape[-1]), outs[-1][:, :-1]), dim=1)
            x = torch.cat((self.input_norm(next_embeds), self.hidden_norm(h)), dim=-1)
            q = _rotate(self.q(x).view(b, t, c.heads, c.head_dim).transpose(1, 2), cos, sin)
            key = _rotate(self.k(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2), cos, sin)
            keys.append(key.repeat_interleave(groups, dim=1))  # (B, H, T, hd)
            values.append(self.v(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2).repeat_interleave(groups, dim=1))
            scale = c.head_dim**-0.5
            scores = [q @ keys[0].transpose(-1, -2) * scale]  # (B, H, T, T): the target-read keys
            allowed = pos[None, :] <= (pos[:, None] - k)
            scores[0] = scores[0].masked_fill(~allowed, float("-inf"))
            for j in range(1, k + 1):  # the chain's own keys: step j's at position i-k+j
                shifted = _shift(keys[j], k - j)
                scores.append((q * shifted).sum(-1, keepdim=True) * scale)  # (B, H, T, 1)
            p = torch.cat(scores, dim=-1).softmax(-1)
            out = p[..., :t] @ values[0]
            for j in range(1, k + 1):
                out = out + p[..., t + j - 1 : t + j] * _shift(values[j], k - j)
            h = h + self.o(out.transpose(1, 2).reshape(b, t, -1))
            y = self.mlp_norm(h)
            outs.append(h + self.down(F.silu(self.gate(y)) * self.up(y)))
        return outs


def _shift(x: torch.Tensor, by: int) -> torch.Tensor:
    """x (..., T, d) moved `by` positions later along T (row i holds row i-by), zeros first."""
    if by == 0:
        return x
    return torch.cat((x.new_zeros(*x.shape[:-2], by, x.shape[-1]), x[..., :-by, :]), dim=-2)
