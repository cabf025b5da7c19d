"""A model's weights as the products the lean forward runs, built once per model and weight source.

The q/k/v and gate/up projections run as one product each (the modules' parameters become views into the fused
weights, so nothing is duplicated). The products are `specula.engine.cpu.products`'s: a GGUF's blocks through the
compiled step's own kernels, or through torch's int4 kernel when the model was loaded with native weights, otherwise
the dense weights, prepacked for oneDNN on a CPU in bf16 (a second copy of them, for models up to
PREPACK_LIMIT_BYTES). Which modules hold the weights, where each norm sits and of which kind, and what every layer
does differently come from the model's spec (families/): nothing here asks a module what it has.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..cpu import step as cpu_step
from ..cpu.products import (
    BLOCK_FORMATS,
    Blocks,
    Dense,
    FileBlocks,
    Int4,
    Q4Blocks,
    Tiles,
    can_prepack,
    int4_fits,
    stable_rows_of,
)
from .families import NORM_SLOTS, Spec, spec_for
from .gguf import FileHead, NativeWeights, weight_device, weight_dtype

log = logging.getLogger(__name__)

PREPACK_LIMIT_BYTES = 4 << 30  # larger models keep one copy of their dense weights (unpacked)
# per model, beside it rather than on it (a copy of the model must not carry oneDNN's opaque weights, which cannot be
# copied): its products from fused_layers
_FUSED: "weakref.WeakKeyDictionary[torch.nn.Module, _Fused]" = weakref.WeakKeyDictionary()


def supports(model: torch.nn.Module) -> bool:
    """True when the lean forward reproduces this model's own forward: its spec has a family and no gaps, and the
    modules the spec names are there."""
    spec = spec_for(model)
    if not spec.runs:
        return False
    try:
        tables = rotary_tables(model, spec)
        layer = model.model.layers[0]
        for name in (*spec.family.qkv, *spec.family.gate_up, "self_attn.o_proj", "mlp.down_proj", *spec.norms.values()):
            layer.get_submodule(name)
        model.model.norm.weight  # noqa: B018 - the final norm
    except (AttributeError, KeyError):
        return False
    return bool(tables)


def _projections(layer: torch.nn.Module, spec: Spec) -> tuple[tuple, tuple]:
    """A layer's ((names, modules) of q/k/v, (names, modules) of gate/up): three and two modules, or one each where
    the family stores them fused (Phi-3's, in the same row order)."""
    qkv, gate_up = spec.family.qkv, spec.family.gate_up
    return ((qkv, tuple(layer.get_submodule(n) for n in qkv)), (gate_up, tuple(layer.get_submodule(n) for n in gate_up)))


@dataclass(frozen=True)
class RotaryTable:
    """One rotary table: inverse frequencies (as many as half the rotated dimensions: fewer than half a head where
    only part of it rotates, Phi-4-mini's), the attention scaling, and for `longrope` (Phi-3.5, Phi-4-mini) the
    frequencies of the positions from `long_from` on."""

    inv_freq: torch.Tensor
    scale: float = 1.0
    long_inv_freq: torch.Tensor | None = None
    long_from: int = 0


def rope_kinds(spec: Spec) -> tuple[str | None, ...]:
    """The kinds of layer with their own rotary table (Gemma 3's local and global layers), in the order of the
    model's layers; (None,): one table for every layer."""
    kinds = tuple(dict.fromkeys(layer.rope_kind for layer in spec.layers))
    return (None,) if kinds in ((), (None,)) else kinds


def rotary_tables(model: torch.nn.Module, spec: Spec) -> list[RotaryTable]:
    """The model's rotary tables (rope_kinds), as its rotary module computed them from the config (llama.cpp's
    per-dimension factors applied where the file had them). transformers' longrope takes its long factors for every
    position of a call that reaches past the original window; here a position takes them from there on, whatever the
    call (the same for every call within the window and for steps past it)."""
    rotary = model.model.rotary_emb
    kinds = rope_kinds(spec)
    if kinds == (None,):
        scale = float(getattr(rotary, "attention_scaling", 1.0))
        if getattr(rotary, "rope_type", "default") == "longrope":
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            original = int(getattr(model.config, "original_max_position_embeddings", None)
                           or model.config.rope_parameters.get("original_max_position_embeddings"))
            long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, rotary.inv_freq.device, seq_len=original + 1)
            return [RotaryTable(rotary.original_inv_freq, scale, long_inv, original)]
        return [RotaryTable(rotary.inv_freq, scale)]
    return [RotaryTable(getattr(rotary, f"{kind}_inv_freq"), float(getattr(rotary, f"{kind}_attention_scaling", 1.0)))
            for kind in kinds]


def context_window(config) -> int:
    """The positions a model reads: its own limit (a sliding window is kept per layer, not a limit)."""
    return int(getattr(config, "max_position_embeddings", 2048) or 2048)


def _fuse_rows(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input; the modules' own parameters
    become views into it, so the model still works as before and no memory is duplicated."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = all(lin.bias is not None for lin in linears)
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = torch.nn.Parameter(weight[row : row + n], requires_grad=False)
        if has_bias:
            lin.bias = torch.nn.Parameter(bias[row : row + n], requires_grad=False)
        row += n
    return weight, bias


class Norm(NamedTuple):
    """An RMS norm as the lean forward runs it: its scale and epsilon. `wide`: the scale is fp32 and multiplies the
    normalised fp32 rows before they are rounded to the model's dtype (Gemma's `1 + w`, folded into `weight`);
    otherwise transformers' Llama norm: rounded first, then scaled in the model's dtype."""

    weight: torch.Tensor
    eps: float
    wide: bool = False


def norm_of(module: torch.nn.Module, spec: Spec) -> Norm:
    """A transformers RMS norm module as a Norm of the spec's kind: its offset (Gemma's 1) added to the weight in
    fp32, wide where the family's norms scale before rounding."""
    weight = module.weight.detach()
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    if spec.wide_norms:
        return Norm((weight.float() + spec.norm_offset).contiguous(), eps, True)
    return Norm(weight, eps)


def first_norm(layer: LayerWeights) -> Norm:
    """A layer's first norm (they share their epsilon and kind)."""
    return next(n for n in layer.norms.values() if n is not None)


def own_ops():
    """The compiled step's library where its own products run here (x86-64 with AVX2 or better, and
    SPECULA_PRODUCTS=torch not asked), or None."""
    if os.environ.get("SPECULA_PRODUCTS", "own").strip().lower() == "torch":
        return None
    ops = cpu_step.ops()
    return ops if ops is not None and ops.blocks_path(-1) >= 2 else None


def activation(spec: Spec):
    """The MLP gate's activation as transformers computes it (its own function, for the same bits)."""
    from transformers.activations import ACT2FN

    return ACT2FN[spec.activation]


class LayerWeights:
    """One decoder layer's products (fused q/k/v, o, fused gate/up, down), its norms and what its spec says of it."""

    def __init__(self, layer: torch.nn.Module, i: int, native: NativeWeights | None, prepack: bool, spec: Spec) -> None:
        prefix = f"model.layers.{i}"
        attn, mlp = layer.self_attn, layer.mlp
        (qkv_names, linears), (gate_up_names, gate_up) = _projections(layer, spec)
        if any(lin.bias is not None for lin in linears) and not all(lin.bias is not None for lin in linears):
            raise ValueError("mixed projection biases")
        as_is = linears[0].weight.is_meta  # a GGUF loaded as it is: no int4 copies beside the file's blocks
        blocks = native.blocks if native is not None and not as_is else {}
        tensors = native.tensors if native is not None else {}
        dtype = linears[0].weight.dtype
        self.file_parts: list[list[FileBlocks] | None] = []  # per product: the file's blocks the compiled step runs

        def file_parts(names: tuple[str, ...]) -> list[FileBlocks] | None:
            parts = [tensors.get(f"{prefix}.{n}") for n in names]
            return parts if all(p is not None and p.type_name in BLOCK_FORMATS for p in parts) else None

        def joined_bias(mods: tuple[torch.nn.Linear, ...]) -> torch.Tensor | None:
            biases = [m.bias.detach() for m in mods if m.bias is not None]
            return torch.cat(biases) if len(biases) == len(mods) else None

        def product(names: tuple[str, ...], mods: tuple[torch.nn.Linear, ...]):
            parts = file_parts(names)
            if mods[0].weight.is_meta:  # a GGUF loaded as it is (from_gguf.py): the file's blocks are the weight
                if parts is None or cpu_step.ops() is None:
                    raise ValueError(f"{prefix}: no weights but the file's blocks, and nothing to run them with")
                self.file_parts.append(parts)
                return Blocks(cpu_step.ops(), parts, joined_bias(mods))
            from_file = native is not None and native.file is not None  # a GGUF loaded as it is (from_gguf.py)
            ops = own_ops() if from_file and mods[0].weight.device.type == "cpu" else None
            if ops is not None and mods[0].weight.dtype == torch.bfloat16:
                # a GGUF's dense bf16 weights (its own bf16 values, or another type made dense): tiles only, the
                # module's copies dropped (their parameters go to the meta device, as a file's blocks' do)
                self.file_parts.append(parts)
                tiles = Tiles.alone(ops, [m.weight.detach() for m in mods], joined_bias(mods))
                for m in mods:
                    m.weight = torch.nn.Parameter(torch.empty(m.weight.shape, dtype=m.weight.dtype, device="meta"),
                                                  requires_grad=False)
                return tiles
            if len(mods) == 1:
                weight, bias = mods[0].weight.detach(), None if mods[0].bias is None else mods[0].bias.detach()
            else:
                weight, bias = _fuse_rows(*mods)
            keys = [f"{prefix}.{n}" for n in names]
            self.file_parts.append(parts)
            if all(k in blocks for k in keys) and int4_fits(tuple(weight.shape)):
                # the file's 4-bit blocks as they are; prompts run dense
                return Int4(Q4Blocks.cat([blocks[k] for k in keys]), bias, dtype, dense=Dense(weight, bias))
            return Dense(weight, bias, prepack)

        self.qkv = product(qkv_names, linears)
        self.o_proj = product(("self_attn.o_proj",), (attn.o_proj,))
        self.gate_up = product(gate_up_names, gate_up)
        self.down = product(("mlp.down_proj",), (mlp.down_proj,))
        self.inter = sum(m.weight.shape[0] for m in gate_up) // 2
        self.act = activation(spec)
        self.gelu = spec.gelu  # the gate's activation: GELU with tanh (Gemma), else SiLU
        # the norms by where they sit (NORM_SLOTS; None: none there): before attention and before the MLP
        # (None: the input as it is, OLMo 2's), on attention's and the MLP's outputs (Gemma, OLMo 2)
        self.norms: dict[str, Norm | None] = dict.fromkeys(NORM_SLOTS)
        for slot, name in spec.norms.items():
            self.norms[slot] = norm_of(layer.get_submodule(name), spec)
        # each query and key head normed before rotary (Qwen3, Gemma 3), or all query heads together and all key heads
        # together (OLMo 2: norms as wide as the projections, `whole_qk_norms`)
        heads = spec.family.qk_norms
        self.q_norm = norm_of(attn.q_norm, spec) if heads else None
        self.k_norm = norm_of(attn.k_norm, spec) if heads else None
        self.whole_qk_norms = heads == "whole"
        # a sliding-window layer sees the last `window` positions up to its own (0: all); its rotary is that of its
        # kind of layer (rope_kinds: Gemma 3's local and global layers have their own bases)
        own = spec.layers[i]
        self.rotary, self.window = own.rotary, own.window
        self.rope_set = rope_kinds(spec).index(own.rope_kind)
        # to see the model's weights replaced (a copy, .to(dtype or device)) after the products were built
        self._watch = tuple((p, p.data_ptr()) for p in _watched(layer, spec))

    @property
    def products(self) -> tuple:
        return (self.qkv, self.o_proj, self.gate_up, self.down)


def _prepack(model: torch.nn.Module) -> bool:
    """Prepack dense weights for oneDNN (a second copy of them) where it applies and they are small
    enough that the copy cannot exhaust memory."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return can_prepack(model.lm_head.weight) and total <= PREPACK_LIMIT_BYTES


def _probe(layers: list[LayerWeights], lm_head: Dense, dtype: torch.dtype, device: torch.device) -> None:
    """Measure once per kind and shape of product (on the CPU, where single steps and verify passes must
    round alike) from how many rows a row's bits stop depending on the call's other rows; every product
    of that kind and shape takes the answer (quant.stable_rows_of). The shape matters: oneDNN sums the
    longer inputs differently for one row than for several (SmolLM2's MLP down projection, 1536 inputs,
    rounds a lone row apart where its 576-input products do not)."""
    shapes: dict[tuple[str, int, int], list] = {}
    for product in [p for layer in layers for p in layer.products] + [lm_head]:
        shapes.setdefault((product.kind, product.in_features, product.out_features), []).append(product)
    for key, products in shapes.items():
        if key[0] in ("blocks", "tiles-unpack"):  # a row's bits never depend on the call's other rows (tested)
            continue
        rows = stable_rows_of(products, dtype, device) if device.type == "cpu" else 2
        if rows == 0 and dtype != torch.float32:  # fp32 near ties: too rare to matter
            log.warning("%s products (%d -> %d) give a row other bits in calls of other sizes on this CPU: "
                        "speculation may part from plain decoding at near ties", *key)
        for product in products:
            product.stable_rows = rows or 2


def _watched(layer: torch.nn.Module, spec: Spec) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights whose replacement (a copy of the model, .to(dtype or device)) means the products are stale."""
    (_, qkv), (_, gate_up) = _projections(layer, spec)
    return qkv[0].weight, gate_up[0].weight


def _still_fused(layers: list[LayerWeights], model: torch.nn.Module, spec: Spec) -> bool:
    """False when the model's weights were replaced since fusing (a copy, .to(dtype or device))."""
    return len(layers) == len(model.model.layers) and all(
        all(p is now and p.data_ptr() == ptr for (p, ptr), now in zip(mine._watch, _watched(layer, spec)))
        for mine, layer in zip(layers, model.model.layers)
    )


def fused_layers(model: torch.nn.Module, native: NativeWeights | None, after_layer=None) -> tuple[list[LayerWeights], Dense]:
    """Build the products once per model and weight source: runners for the same model (the target,
    layer skip, a draft that is the target itself) share them. `after_layer()` runs after each layer's."""
    cached = _FUSED.get(model)
    spec = spec_for(model)
    if cached is None or cached.native is not native or not _still_fused(cached.layers, model, spec):
        prepack = native is None and _prepack(model)  # a GGUF's own weights: no second copy for oneDNN
        layers = []
        for i, layer in enumerate(model.model.layers):
            layers.append(LayerWeights(layer, i, native, prepack, spec))
            if after_layer is not None:
                after_layer()
        head = model.lm_head
        if isinstance(head, FileHead):
            lm_head = head.product
        else:
            lm_head = Dense(head.weight.detach(), None if head.bias is None else head.bias.detach(), prepack)
        _probe(layers, lm_head, weight_dtype(head), weight_device(head))
        cached = _Fused(native, layers, lm_head)
        _FUSED[model] = cached
    return cached.layers, cached.lm_head


def build_products(model: torch.nn.Module, native: NativeWeights | None, after_layer=None) -> None:
    """Build the model's products now (the file's blocks packed into their layout), rather than at its first
    runner: from_gguf.py gives back the file's pages read for each layer (`after_layer`)."""
    fused_layers(model, native, after_layer)


@dataclass(frozen=True)
class _Fused:
    """A model's products, built once per weight source (`native`: the GGUF's blocks, or None)."""

    native: NativeWeights | None
    layers: list[LayerWeights]
    lm_head: Dense


def final_norm(model) -> tuple:
    """The model's final RMS norm as (its scale in fp32, epsilon): the weight, plus its spec's offset (Gemma's 1)."""
    norm = model.model.norm
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    return norm.weight.detach().float() + spec_for(model).norm_offset, eps


def embedding_scale(module) -> float:
    """What the model's embedding module multiplies its rows by (Gemma's sqrt(hidden)); 1.0 for most."""
    return float(getattr(module, "scalar_embed_scale", 1.0))


class Multiplied(torch.nn.Module):
    """An embedding whose rows are multiplied by a number, in the model's dtype (Granite's embedding multiplier)."""

    def __init__(self, embed: torch.nn.Module, multiplier: float) -> None:
        super().__init__()
        self.embed, self.multiplier = embed, multiplier

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * self.multiplier
