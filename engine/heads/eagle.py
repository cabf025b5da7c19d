"""An EAGLE-style draft head (Li et al. 2024): one decoder layer that reads the target's final hidden
state at position t and the embedding of token t+1, and predicts the hidden state at t+1; the target's
own final norm and LM head turn that prediction into a token. It drafts by feeding its predictions back
in, with a small KV cache of its own.

Stored by `store.py` as DIR/head.safetensors (weights) and DIR/head.json (kind, dimensions, the target it
was trained for, training figures). A head only loads for the model it was trained on.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import HeadConfig


def _rope(positions: torch.Tensor, config: HeadConfig, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.outer(positions.float(), config.inverse_frequencies(positions.device))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class EagleHead(nn.Module):
    """An `AutoregressiveHead` (protocol.py): an EAGLE-1/2 head, and the base of the EAGLE-3 and published ones."""

    # what the head reads and predicts: the target's final hidden states before its final norm (Specula's
    # heads; the drafter puts predictions through the target's norm and LM head), or after it (published
    # EAGLE heads: predictions go to the LM head as they are)
    reads_normed = False
    # the target layers whose entering states it reads (EAGLE-3 heads); (): the final hidden states
    aux_layers: tuple[int, ...] = ()
    # its logits through its own final norm and LM head (`draft_logits`, EAGLE-3), else the target's
    own_lm_head = False
    # the layer through the compiled step while drafting (`native.NativeLayer`, set by `store.for_drafting`)
    native = None

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embed: nn.Module | None = None  # its own copy of the target's embeddings (published files), else None
        self.feature_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.embed_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.fc = nn.Linear(2 * c.hidden, c.hidden, bias=False)
        self.attn_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)
        # RMS norms over each head's queries and keys before rotary, where a published head's layer has them (Qwen3)
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        self._k = self._v = torch.empty(0)  # (kv_heads, capacity, head_dim): the drafting cache
        self._length = 0
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        # the token ids the head may draft (the most frequent in its training answers); empty: all
        self.register_buffer("draft_ids", torch.empty(0, dtype=torch.long))

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, start: int = 0,
                use_cache: bool = False) -> torch.Tensor:
        """features (B, T, D) at positions start.., embeddings of the tokens that followed them (B, T, D)
        -> predicted features of the following positions (B, T, D). With use_cache (B = 1), keys and
        values go to the drafting cache at positions start.. and attention sees the cache before them."""
        c = self.config
        b, t, _ = features.shape
        if use_cache and self.native is not None:
            h, e = self.native_inputs(features[0], next_embeds[0])
            return self.native.run(h, e, start)[None]
        h, x = self.inputs(features, next_embeds)
        q = self._q_normed(self.q(x).view(b, t, c.heads, c.head_dim).transpose(1, 2))
        k = self._k_normed(self.k(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2))
        v = self.v(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._rope(torch.arange(start, start + t, device=h.device), h.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if use_cache:
            self._store(k[0], v[0], start)
            keys, values = self._k[:, : start + t][None], self._v[:, : start + t][None]
            mask = None
            if t > 1:
                mask = torch.arange(start + t, device=h.device)[None, :] <= torch.arange(start, start + t, device=h.device)[:, None]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + self.o(out.transpose(1, 2).reshape(b, t, -1))
        x = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))

    def forward_tree(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor, slot: int,
                     visible: torch.Tensor) -> torch.Tensor:
        """Tree drafting: rows (n, D) at rotary `positions` (n,) go to cache slots slot..slot+n-1; row i
        attends to the cache slots where visible[i] (n, slot+n) is True (the real context, its ancestors,
        itself) -> predicted features (n, D)."""
        c = self.config
        n = features.shape[0]
        if self.native is not None:
            h, e = self.native_inputs(features, next_embeds)
            return self.native.run(h, e, slot, positions, visible)
        h, x = self.inputs(features, next_embeds)
        q = self._q_normed(self.q(x).view(n, c.heads, c.head_dim).transpose(0, 1))
        k = self._k_normed(self.k(x).view(n, c.kv_heads, c.head_dim).transpose(0, 1))
        v = self.v(x).view(n, c.kv_heads, c.head_dim).transpose(0, 1)
        cos, sin = self._rope(positions, h.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        self._store(k, v, slot)
        keys, values = self._k[:, : slot + n][None], self._v[:, : slot + n][None]
        out = F.scaled_dot_product_attention(q[None], keys, values, attn_mask=visible, enable_gqa=True)[0]
        h = h + self.o(out.transpose(0, 1).reshape(n, -1))
        x = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))

    def draft_logits(self, outs: torch.Tensor) -> torch.Tensor:
        """Heads with their own LM head only (`own_lm_head`): an EAGLE-1/2 head's outputs are features, which
        the target's final norm and LM head turn into logits."""
        raise NotImplementedError("an EAGLE-1/2 head's outputs go through the target's final norm and LM head")

    def _q_normed(self, q: torch.Tensor) -> torch.Tensor:
        return q if self.q_norm is None else self.q_norm(q)

    def _k_normed(self, k: torch.Tensor) -> torch.Tensor:
        return k if self.k_norm is None else self.k_norm(k)

    def combine(self, features: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        """A position's input to the layer, from its feature and the embedding of the token after it."""
        return self.fc(torch.cat((self.feature_norm(features), self.embed_norm(next_embeds)), dim=-1))

    def inputs(self, features: torch.Tensor, next_embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A position's residual stream entering the layer, and what its attention reads."""
        h = self.combine(features, next_embeds)
        return h, self.attn_norm(h)

    def native_inputs(self, features: torch.Tensor, next_embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the native layer takes: the residual stream entering the layer, and the embeddings where its
        attention reads them beside it (EAGLE-3), else None."""
        return self.combine(features, next_embeds), None

    def _rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables at these positions, from a table kept between calls (drafting calls this per token)."""
        need = int(positions.max()) + 1
        table = self._rope_table
        if table is None or table[0].shape[0] < need or table[0].dtype != dtype or table[0].device != positions.device:
            size = max(need, 2 * (table[0].shape[0] if table is not None else 0), 512)
            table = _rope(torch.arange(size, device=positions.device), self.config, dtype)
            self._rope_table = table
        return table[0][positions], table[1][positions]

    def _store(self, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        end = start + k.shape[1]
        if self._k.ndim != 3 or self._k.shape[1] < end:
            cap = max(256, 2 * end)
            nk = k.new_zeros((k.shape[0], cap, k.shape[2]))
            nv = v.new_zeros((v.shape[0], cap, v.shape[2]))
            if self._k.ndim == 3:
                nk[:, : self._length] = self._k[:, : self._length]
                nv[:, : self._length] = self._v[:, : self._length]
            self._k, self._v = nk, nv
        self._k[:, start:end] = k
        self._v[:, start:end] = v
        self._length = end

    def truncate(self, length: int) -> None:
        self._length = min(self._length, max(0, length))
