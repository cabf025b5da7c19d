"""An EAGLE head's decoder layer through the compiled step (`cpu/native/step.cpp`, `head_layer`): the layer's
norms, rotary, cache writes, attention and SiLU as the target's own fused loops, its four products (fused
q/k/v, o, fused gate/up, down) as a file format's blocks (`store.HEAD_BLOCKS`), and its drafting cache in fp32
beside them, as the target's.

A draft token then costs one library call for the layer instead of about forty small torch operations, each
a few microseconds of dispatch around products of a few tens of microseconds (docs/bench/history/2026-12-03.md, "The head's
layer in one call"). Drafting only: the head's own modules stay what training and the tests compare with, and
the drafts may round otherwise than theirs; what the target keeps never depends on them.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..cpu.products import GROUP, Blocks, FileBlocks
from ..cpu.step import StepLayer, StepModel, register
from .eagle import EagleHead
from .eagle3 import Eagle3Head

KB = 16  # keys per block of the transposed key cache (native/step.cpp's KB)


def applies(head: EagleHead) -> bool:
    """Whether the layer can run natively: an RMS norm before its attention (published EAGLE-1 heads have
    none: they keep the torch layer), the stream entering it as its residual (not a published EAGLE-3 head whose
    residual is the normed stream), no norms over its queries and keys (a Qwen3 layer's) and every product's
    input whole blocks of 32."""
    eagle3 = isinstance(head, Eagle3Head)
    if eagle3 and head.variant.normed_residual or head.q_norm is not None:
        return False
    norm = head.hidden_norm if eagle3 else head.attn_norm
    if not isinstance(norm, nn.RMSNorm) or not isinstance(head.mlp_norm, nn.RMSNorm):
        return False
    linears = [head.q, head.o, head.gate, head.down]
    return all(linear.in_features % GROUP == 0 for linear in linears)


def _blocks(ops, linears: list[nn.Linear], fmt: str) -> Blocks:
    """Linear layers of one input size stacked along the output, quantized to `fmt` blocks."""
    parts = [FileBlocks.quantize(linear.weight.detach().float(), fmt) for linear in linears]
    biases = [linear.bias for linear in linears]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach() if b is not None else torch.zeros(linear.out_features, dtype=linear.weight.dtype)
                          for b, linear in zip(biases, linears)])
    return Blocks(ops, parts, bias)


class NativeLayer:
    """The layer of `head` (EagleHead or Eagle3Head) registered with the compiled step, with its drafting cache:
    `run` takes the residual stream entering the layer (and, EAGLE-3, the next tokens' embeddings) and gives
    the layer's output, writing keys and values at the slots given."""

    def __init__(self, ops, head: EagleHead, fmt: str) -> None:
        c = head.config
        self.ops = ops
        self.dtype = head.q.weight.dtype
        products = [_blocks(ops, [head.q, head.k, head.v], fmt), _blocks(ops, [head.o], fmt),
                    _blocks(ops, [head.gate, head.up], fmt), _blocks(ops, [head.down], fmt)]
        # EAGLE-3's attention reads [norm(embedding), norm(h)]; EAGLE-1's norm(h)
        two = isinstance(head, Eagle3Head)
        in_norm = head.hidden_norm if two else head.attn_norm
        self.e_norm = head.input_norm.weight.detach() if two else None
        layer = StepLayer(tuple(products), attn_in=in_norm.weight.detach(), mlp_in=head.mlp_norm.weight.detach())
        self.handle = register(ops, StepModel(c.heads, c.kv_heads, c.head_dim, c.intermediate, float(c.eps),
                                              float(c.head_dim) ** -0.5), [layer])
        self.products = products  # the packed weights live as long as the handle
        self.kv, self.head_dim = c.kv_heads, c.head_dim
        self._inv_freq = c.inverse_frequencies()
        self._k = self._v = self._kt = torch.empty(0)
        self._cos = self._sin = torch.empty(0)

    def run(self, h: torch.Tensor, e: torch.Tensor | None, start: int, positions: torch.Tensor | None = None,
            visible: torch.Tensor | None = None) -> torch.Tensor:
        """h (t, D) at cache slots start..start+t-1 -> the layer's output (t, D). Rotary `positions` (t,), or
        the slots' own; row r sees the slots `visible` (t, start + t) allows, or every slot up to its own."""
        t = h.shape[0]
        if positions is None:
            positions, last = torch.arange(start, start + t), start + t
        else:
            last = int(positions.max()) + 1 if t else 0
        self._reserve(start + t, last)
        return self.ops.head_layer(self.handle, h.to(self.dtype), None if self.e_norm is None else e.to(self.dtype),
                                   self.e_norm, self._k, self._v, self._kt, self._cos, self._sin, positions, start, visible)

    def norm(self, x: torch.Tensor, norm: nn.RMSNorm) -> torch.Tensor:
        """An RMS norm of the head's (its final norm) through the compiled step's: one call."""
        return self.ops.rms_norm(x.to(self.dtype), norm.weight, float(norm.eps if norm.eps is not None else 1e-6))

    def _reserve(self, slots: int, positions: int) -> None:
        cap = self._k.shape[1] if self._k.ndim == 3 else 0
        if slots > cap:
            new = -(-max(256, 2 * slots) // KB) * KB
            k = torch.zeros(self.kv, new, self.head_dim)
            v = torch.zeros_like(k)
            kt = torch.zeros(self.kv, new // KB, self.head_dim, KB)
            if cap:
                k[:, :cap], v[:, :cap] = self._k, self._v
                kt[:, : cap // KB] = self._kt.view(self.kv, cap // KB, self.head_dim, KB)
            self._k, self._v, self._kt = k, v, kt
        if positions > self._cos.shape[0]:
            size = max(positions, 2 * self._cos.shape[0], 512)
            freqs = torch.outer(torch.arange(size, dtype=torch.float32), self._inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            half = self.head_dim // 2
            sin = emb.sin()
            # rotate_half folded into the table, as the target's compiled step takes it
            self._cos, self._sin = emb.cos().contiguous(), torch.cat((-sin[:, :half], sin[:, half:]), dim=-1).contiguous()

    def __del__(self) -> None:
        try:
            self.ops.release(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
