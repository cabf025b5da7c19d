"""What a runner holds of its answer: every position's keys and values per layer, the compiled step's copies of them,
the token at each position, the last layer's hidden states (and the kept layers' states an EAGLE-3 head reads), and the
rotary tables for every position it can hold. One object owns them: it grows them together, rolls them back together
and keeps a tree pass's chosen path in all of them; the passes (the eager forward in runner.py, the compiled step in
compiled.py, a GPU's static steps in static.py) read and write the buffers it hands them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..api.errors import ContextTooLongError
from .attention import whole_blocks

GROW = 256  # capacity grows in steps of this many positions
KB = 16  # positions per block of the compiled step's transposed keys


@dataclass(frozen=True)
class Shape:
    """What a cache holds per position: layers x KV heads x head size of keys and values, the hidden size of the
    kept states, their dtypes and device, and how many positions it may hold."""

    layers: int
    kv_heads: int
    head_dim: int
    hidden: int
    dtype: torch.dtype  # the model's (hidden states, rotary tables for the eager forward)
    kv_dtype: torch.dtype  # the keys' and values' (fp32 on a CPU's blocked attention)
    device: torch.device
    max_len: int  # positions it may hold
    window: int  # the model's context window (max_len is its first positions where the cache is static)
    static: bool = False  # allocated once for max_len positions and a scratch slot (a GPU's static steps)
    narrow_values: bool = False  # a bf16 copy of the values for the compiled step's single steps


class Cache:
    """The positions of one answer: keys `k` and values `v` (layers, KV heads, capacity, head size); the compiled
    step's transposed keys `kt` (in step with `k` for the first `kt_len` positions) and bf16 values `vn`; the token
    `ids` of each position (host memory); the last layer's states `feat` and the kept layers' `aux`; rotary tables
    `cos`/`sin` (the model's dtype) and `cos32`/`sin32` (fp32) for every position of the capacity. `length`
    positions are held."""

    def __init__(self, shape: Shape, rotary: list) -> None:
        self.shape = shape
        self.rotary = rotary  # per kind of layer with its own table: (inverse frequencies, scaling, a long-context part)
        self.rotary_dims = 2 * rotary[0].inv_freq.shape[0]  # the dimensions of a head that rotate (all, or a part)
        self.length = 0
        self.k = self.v = torch.empty(0)
        self.kt = torch.empty(0)
        self.kt_len = 0
        self.vn = torch.empty(0)
        self.ids = torch.empty(0, dtype=torch.long)
        self.feat = torch.empty(0)
        self.aux_layers: tuple[int, ...] = ()
        self.aux = torch.empty(0)
        self.cos = self.sin = self.cos32 = self.sin32 = torch.empty(0)
        if shape.static:
            self.reserve(shape.max_len)

    @property
    def capacity(self) -> int:
        return self.k.shape[2] if self.k.ndim == 4 else 0

    def reserve(self, needed: int) -> None:
        """Room for `needed` positions (ContextTooLongError past max_len), what is held kept."""
        s = self.shape
        if needed > s.max_len:
            held = ("the model's window" if s.max_len == s.window else
                    f"the {s.window}-token window's first positions, which a static cache holds (SPECULA_CONTEXT)")
            raise ContextTooLongError(f"context of {needed} tokens exceeds {held}: {s.max_len}")
        capacity = self.capacity
        if needed <= capacity:
            return
        if s.static:  # once, for good: the whole context and the scratch slot
            new_cap = s.max_len + 1
        else:  # whole key blocks (positions past the window stay unused)
            new_cap = whole_blocks(min(s.max_len, max(needed, 2 * capacity, GROW)))
        n = self.length

        def grown(old: torch.Tensor, shape: tuple, dtype: torch.dtype, device=s.device, axis: int = 0) -> torch.Tensor:
            new = torch.zeros(shape, dtype=dtype, device=device)
            if capacity and old.shape[:axis] + old.shape[axis + 1 :] == new.shape[:axis] + new.shape[axis + 1 :]:
                new.narrow(axis, 0, n).copy_(old.narrow(axis, 0, n))
            return new

        kv_shape = (s.layers, s.kv_heads, new_cap, s.head_dim)
        self.k = grown(self.k, kv_shape, s.kv_dtype, axis=2)
        self.v = grown(self.v, kv_shape, s.kv_dtype, axis=2)
        self.ids = grown(self.ids, (new_cap,), torch.long, device=torch.device("cpu"))
        self.feat = grown(self.feat, (new_cap, s.hidden), s.dtype)
        self.aux = grown(self.aux, (new_cap, len(self.aux_layers), s.hidden), s.dtype)
        self._tables(new_cap)

    def _tables(self, capacity: int) -> None:
        """Rotary tables for every position the cache can hold, computed in fp32 as transformers does, one per kind
        of layer with its own: (tables, capacity, head size)."""
        device = self.shape.device
        pos = torch.arange(capacity, device=device, dtype=torch.float32)
        cos32, sin32 = [], []
        half = self.rotary_dims // 2
        for table in self.rotary:
            freqs = torch.outer(pos, table.inv_freq.float().to(device))  # (capacity, rotated / 2)
            if table.long_inv_freq is not None:
                late = pos[table.long_from :]
                freqs[table.long_from :] = torch.outer(late, table.long_inv_freq.float().to(device))
            emb = torch.cat((freqs, freqs), dim=-1)  # (capacity, rotated dims)
            cos32.append(emb.cos() * table.scale)
            sin = emb.sin() * table.scale
            # rotate_half(x) * sin == roll(x, half) * [-sin | sin] bit for bit, in two fewer operations
            sin32.append(torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))
        self.cos = torch.stack(cos32).to(self.shape.dtype)
        self.sin = torch.stack(sin32).to(self.shape.dtype)
        # the compiled step's tables: fp32, not rounded to the model's dtype
        self.cos32 = torch.stack(cos32).contiguous()
        self.sin32 = torch.stack(sin32).contiguous()

    def begin(self, start: int, tokens: torch.Tensor) -> None:
        """A pass of `tokens` from position `start`: room for them, and their ids."""
        end = start + tokens.shape[0]
        self.reserve(end)
        self.ids[start:end] = tokens.cpu()

    def held(self, end: int, copies: bool = False) -> None:
        """A pass wrote positions up to `end`: `length` is end (and the compiled step's copies are in step up to it
        where the pass wrote them, `copies`)."""
        self.length = end
        self.kt_len = end if copies else min(self.kt_len, end)

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(0, length))
        self.kt_len = min(self.kt_len, self.length)

    def step_copies(self) -> None:
        """The compiled step's transposed keys and bf16 values, allocated again (and filled from k and v) when the
        cache grew."""
        narrow = self.v.shape if self.shape.narrow_values else (0,)
        if self.kt.numel() != self.k.numel() or self.vn.shape != narrow:
            layers, kv, cap, hd = self.k.shape
            self.kt = torch.zeros((layers, kv, cap // KB, hd, KB), dtype=torch.float32, device=self.shape.device)
            self.vn = torch.zeros(narrow, dtype=torch.bfloat16, device=self.shape.device)
            self.kt_len = 0

    def keep_layers(self, layers: tuple[int, ...]) -> bool:
        """From the next prompt on, keep the states entering these layers for every position; whether that changed
        (the cache then holds nothing: no position has them yet)."""
        if layers == self.aux_layers:
            return False
        self.aux_layers = layers
        self.length = self.kt_len = 0
        hidden = self.feat.shape[-1] if self.feat.ndim == 2 else 0
        self.aux = torch.zeros((self.feat.shape[0], len(layers), hidden), dtype=self.shape.dtype, device=self.shape.device)
        return True

    def _check(self, start: int, end: int) -> None:
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"positions {start}..{end} are not all in the cache of {self.length}")

    def features(self, start: int, end: int) -> torch.Tensor:
        """The final hidden states (before the final norm) of positions start..end-1, (end-start, D)."""
        self._check(start, end)
        return self.feat[start:end]

    def aux_features(self, start: int, end: int) -> torch.Tensor:
        """The kept layers' states of positions start..end-1, side by side in layer order (end-start, layers * D)."""
        self._check(start, end)
        return self.aux[start:end].reshape(end - start, -1)

    def keep(self, start: int, rows: list[int]) -> None:
        """After a tree pass that began at `start`: keep the rows `rows` (a root-to-node path, row 0 first) as
        positions start, start+1, ...; drop the rest."""
        if rows != list(range(len(rows))):
            index = torch.tensor(rows, device=self.shape.device)
            target = torch.arange(start, start + len(rows), device=self.shape.device)
            self.k[:, :, target] = self.k[:, :, start + index]
            self.v[:, :, target] = self.v[:, :, start + index]
            self.feat[target] = self.feat[start + index]
            self.ids[start : start + len(rows)] = self.ids[start + index.cpu()]
            if self.aux_layers:
                self.aux[target] = self.aux[start + index]
            self.kt_len = min(self.kt_len, start)
        self.length = start + len(rows)
        self.kt_len = min(self.kt_len, self.length)  # the dropped rows' slots are rewritten later
