"""How a pass of the lean forward attends: a plan per pass and per window, each computing its own attention.

A prompt read at an empty cache attends causally (`CausalPlan`; `PrefillPlan` where a sliding window cuts it). Later
passes on the CPU attend in fp32 over whole key blocks (`BlockedPlan`): a row's result then depends only on its own
key count, so a verify pass and single steps give the same bits. Other devices use the fused kernel with a mask
(`FusedPlan`). Soft-capped scores (Gemma 2) run the same plans through `capped_attention`, which no fused kernel has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

BLOCK = 32  # CPU attention reads keys in whole blocks of this many positions, the rest masked
_MIN_ROWS = 4  # fewer query rows than this take another matrix kernel on the CPU, so pad up to it


class Heads(NamedTuple):
    """The attention's shape and numbers: query and key/value heads, their width, the scores' scale and cap (0: none)."""

    n_heads: int
    n_kv: int
    head_dim: int
    scale: float
    softcap: float
    dtype: torch.dtype

    @property
    def groups(self) -> int:
        return self.n_heads // self.n_kv


def whole_blocks(n: int) -> int:
    """n rounded up to whole key blocks."""
    return -(-n // BLOCK) * BLOCK


def _block_mask(allowed: torch.Tensor) -> tuple[int, torch.Tensor]:
    """allowed (rows, keys) -> (rows, additive fp32 mask), the mask padded to at least _MIN_ROWS rows
    (copies of the first) so every call takes the same matrix kernel."""
    rows = allowed.shape[0]
    if rows < _MIN_ROWS:
        allowed = torch.cat([allowed, allowed[:1].expand(_MIN_ROWS - rows, -1)])
    mask = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device)
    return rows, mask.masked_fill_(~allowed, float("-inf"))


def cap(x: torch.Tensor, limit: float) -> torch.Tensor:
    """Soft-capping: limit * tanh(x / limit)."""
    return torch.tanh(x / limit) * limit


def capped_attention(q, k, v, allowed: torch.Tensor, scale: float, limit: float) -> torch.Tensor:
    """Attention with soft-capped scores in fp32: queries (H, T, hd) over keys and values (KV, N, hd), row r seeing
    the keys `allowed` (T, N) gives -> (H, T, hd) in q's dtype."""
    groups = q.shape[0] // k.shape[0]
    k, v = k.float().repeat_interleave(groups, 0), v.float().repeat_interleave(groups, 0)
    scores = cap(torch.matmul(q.float(), k.transpose(1, 2)) * scale, limit)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.matmul(scores.softmax(-1), v).to(q.dtype)


@dataclass(frozen=True)
class CausalPlan:
    """A prompt at an empty cache: plain causal attention over its own rows, the fused kernel's."""

    def attend(self, heads: Heads, q, k, v, keys, values, end: int) -> torch.Tensor:
        """Queries (H, T, hd), this pass's keys and values (KV, T, hd), the layer's cache (KV, capacity, hd) ->
        (H, T, hd)."""
        if heads.softcap:
            allowed = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool, device=q.device).tril()
            return capped_attention(q, k, v, allowed, heads.scale, heads.softcap)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=heads.scale,
                                              enable_gqa=True)[0]


@dataclass(frozen=True)
class PrefillPlan:
    """A prompt's attention where a sliding window cuts it: the keys each row sees (T, T) bool."""

    mask: torch.Tensor

    def attend(self, heads: Heads, q, k, v, keys, values, end: int) -> torch.Tensor:
        if heads.softcap:
            return capped_attention(q, k, v, self.mask, heads.scale, heads.softcap)
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=self.mask, scale=heads.scale,
                                              enable_gqa=True)[0]


@dataclass(frozen=True)
class FusedPlan:
    """Attention through the fused kernel (GPUs): the allowed keys of each query row, or None for one
    row that sees the whole cache."""

    mask: torch.Tensor | None  # (groups*T, keys) bool

    def attend(self, heads: Heads, q, k, v, keys, values, end: int) -> torch.Tensor:
        t = q.shape[1]
        if heads.softcap:
            allowed = torch.ones(t, end, dtype=torch.bool, device=q.device) if self.mask is None else self.mask[:t]
            return capped_attention(q, keys[:, :end], values[:, :end], allowed, heads.scale, heads.softcap)
        # grouped-query attention without copying K/V: the query heads that share a KV head become extra query rows
        # of that head, (H, T, hd) -> (KV, groups*T, hd)
        return F.scaled_dot_product_attention(
            q.reshape(heads.n_kv, heads.groups * t, heads.head_dim), keys[:, :end], values[:, :end],
            attn_mask=self.mask, scale=heads.scale).view(heads.n_heads, t, heads.head_dim)


@dataclass(frozen=True)
class KeyBlock:
    """Query rows first_row..end_row-1 of a pass attend over n_keys keys (whole blocks), with an additive
    mask padded to `rows` or more rows (_block_mask)."""

    first_row: int
    end_row: int
    n_keys: int
    rows: int
    mask: torch.Tensor  # (groups*rows', n_keys) fp32

    def attend(self, heads: Heads, q: torch.Tensor, keys, values) -> torch.Tensor:
        """Query rows (H, Tg, hd) over whole key blocks of an fp32 cache, later keys masked -> (H, Tg, hd).
        A row's result depends only on its own key count (rounded up to a block) and not on the other
        rows in the call, so a verify pass and single steps produce the same bits."""
        n_keys, rows, mask = self.n_keys, self.rows, self.mask
        tg = q.shape[1]
        q = (q.float() * heads.scale).reshape(heads.n_kv, rows, heads.head_dim)
        if mask.shape[0] > rows:
            q = torch.cat([q, q[:, :1].expand(-1, mask.shape[0] - rows, -1)], dim=1)
        if heads.softcap:  # Gemma 2: each score capped, cap * tanh(score / cap), before the mask
            scores = cap(torch.bmm(q, keys[:, :n_keys].transpose(1, 2)), heads.softcap) + mask
        else:
            scores = torch.baddbmm(mask, q, keys[:, :n_keys].transpose(1, 2))  # (KV, rows', n_keys)
        out = torch.bmm(scores.softmax(-1), values[:, :n_keys])[:, :rows]  # (KV, rows, hd)
        return out.to(heads.dtype).reshape(heads.n_heads, tg, heads.head_dim)


@dataclass(frozen=True)
class BlockedPlan:
    """Attention on the CPU: fp32 over whole key blocks, one call per group of rows."""

    blocks: tuple[KeyBlock, ...]

    def attend(self, heads: Heads, q, k, v, keys, values, end: int) -> torch.Tensor:
        return torch.cat([b.attend(heads, q[:, b.first_row : b.end_row], keys, values) for b in self.blocks], dim=1)


Plan = CausalPlan | PrefillPlan | FusedPlan | BlockedPlan


def pass_plan(start: int, t: int, window: int, groups: int, blocked: bool, device) -> Plan:
    """How a pass of t rows after `start` cached positions attends: causally for a prompt (a mask where a sliding
    `window` cuts it); otherwise, blocked, the key blocks of its row groups; elsewhere a mask for the fused kernel."""
    end = start + t

    def seen(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:  # (queries, keys) bool
        allowed = keys[None, :] <= queries[:, None]
        return allowed & (keys[None, :] > queries[:, None] - window) if window else allowed

    if start == 0 and t > 1:
        if window and t > window:
            return PrefillPlan(seen(torch.arange(t, device=device), torch.arange(t, device=device)))
        return CausalPlan()
    if not blocked:
        if t == 1 and not (window and end > window):
            return FusedPlan(None)
        keys = torch.arange(end, device=device)
        queries = torch.arange(start, end, device=device)
        return FusedPlan(seen(keys, queries).repeat(groups, 1))  # (groups*T, end)
    found = []
    r0 = 0
    while r0 < t:  # rows whose own key count rounds up to the same block count form one group
        n_keys = whole_blocks(start + r0 + 1)
        r1 = min(t, n_keys - start)
        keys = torch.arange(n_keys, device=device)
        queries = torch.arange(start + r0, start + r1, device=device)
        allowed = seen(keys, queries).repeat(groups, 1)  # (groups*Tg, n_keys)
        rows, mask = _block_mask(allowed)
        found.append(KeyBlock(r0, r1, n_keys, rows, mask))
        r0 = r1
    return BlockedPlan(tuple(found))


def tree_plan(start: int, ancestors: torch.Tensor, depths: torch.Tensor, window: int, groups: int, blocked: bool,
              device) -> Plan:
    """A tree pass: every row sees the cache before `start` and its own ancestors (with a `window`, those among them
    within it of the row's position)."""
    t = ancestors.shape[0]
    n_keys = whole_blocks(start + t) if blocked else start + t
    allowed = torch.zeros((t, n_keys), dtype=torch.bool, device=device)
    allowed[:, :start] = True
    allowed[:, start : start + t] = ancestors
    if window:
        positions = torch.arange(n_keys, device=device)
        positions[start : start + t] = start + depths
        allowed &= positions[None, :] > (start + depths)[:, None] - window
    allowed = allowed.repeat(groups, 1)  # (groups*T, n_keys)
    if not blocked:
        return FusedPlan(allowed)
    rows, mask = _block_mask(allowed)
    return BlockedPlan((KeyBlock(0, t, n_keys, rows, mask),))
