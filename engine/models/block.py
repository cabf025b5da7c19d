"""A decoder layer's arithmetic besides attention, as the eager and static forwards run it: RMS norms of the spec's
kind, the gated MLP, the residual adds (with Granite's multiplier)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layers import LayerWeights, Norm


def call(product, x: torch.Tensor) -> torch.Tensor:
    """A product as it is, one-row kernels included (the lean forward without consistent rounding)."""
    return product(x)


def rms_norm(x: torch.Tensor, norm: Norm | None) -> torch.Tensor:
    """transformers' RMSNorm: normalise in fp32, cast back, scale (Gemma's: scale in fp32, then cast back); None: x."""
    if norm is None:
        return x
    if norm.wide:
        return (F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps) * norm.weight).to(x.dtype)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps).to(x.dtype)


def _mlp(layer: LayerWeights, h: torch.Tensor, run) -> torch.Tensor:
    """The gated MLP of a layer over normed rows h (T, D), its output normed where the layer norms it."""
    gate, up = run(layer.gate_up, h).split(layer.inter, dim=-1)
    return rms_norm(run(layer.down, layer.act(gate) * up), layer.norms["mlp_out"])


def after_attention(runner, layer: LayerWeights, x: torch.Tensor, attn: torch.Tensor, run) -> torch.Tensor:
    """The rest of a layer once its attention's output (after o_proj) is known: both residual adds and the MLP."""
    x = x + _residual(runner, rms_norm(attn, layer.norms["attn_out"]))
    return x + _residual(runner, _mlp(layer, rms_norm(x, layer.norms["mlp_in"]), run))


def _residual(runner, y: torch.Tensor) -> torch.Tensor:
    """A layer's attention or MLP output as it is added to the residual stream (Granite's multiplier; most: as it is)."""
    m = runner.spec.residual_multiplier
    return y if m == 1.0 else y * m
