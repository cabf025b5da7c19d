"""A lean forward for the Llama family and its relatives (Llama, Qwen2/3, Mistral, Ministral, SmolLM2/3, Gemma 3,
Phi-3/4-mini: arch.LEAN_TYPES) over a static KV cache.

It reuses the loaded transformers modules' weights (projections, norms, MLP) and replaces what costs on
the hot path: the q/k/v and gate/up projections run as one product each (the modules' parameters become
views into the fused weights, so nothing is duplicated), attention reads a preallocated cache, rollback
is moving `length`, and no mask is built for single-token steps. The products are `specula.engine.cpu.products`'s: a
GGUF's 4-bit blocks through the int4 kernel when the model was loaded with native weights, otherwise the
dense weights, prepacked for oneDNN on a CPU in bf16 (a second copy of them, for models up to
PREPACK_LIMIT_BYTES). `shallow(n)` gives a runner over the first n layers with its own cache, sharing
the products (early-exit self-speculation).
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..api.errors import ContextTooLongError
from ..cpu import step as cpu_step
from ..cpu.products import (
    BLOCK_FORMATS,
    TILE_COLS,
    Blocks,
    Dense,
    FileBlocks,
    Int4,
    Q4Blocks,
    Tiles,
    can_prepack,
    in_rows,
    int4_fits,
    stable_rows_of,
)
from ..cpu.step import StepMode
from ..decoding.tree import TokenTree
from .arch import GELU_TANH, LEAN_TYPES, describe
from .gguf import LM_HEAD, FileHead, NativeWeights, out_features, weight_device, weight_dtype
from .static import BUCKETS, FLOOR, StepGraphs, StepInputs, bucket, static_context, step_inputs

log = logging.getLogger(__name__)

LLAMA_FAMILY = set(LEAN_TYPES)
WIDE_NORMS = frozenset({"olmo2"})  # families whose norms scale the fp32 rows by w before rounding (besides Gemma's)
# families whose every layer attends over the config's sliding window (transformers passes it to each layer's mask)
WINDOW_EVERYWHERE = frozenset({"mistral", "phi3"})
_GROW = 256  # cache capacity grows in steps of this many positions
_BLOCK = 32  # CPU attention reads keys in whole blocks of this many positions, the rest masked
_MIN_ROWS = 4  # fewer query rows than this take another matrix kernel on the CPU, so pad up to it
# Passes through the compiled step of more rows than this (prompts) run as passes of this many: a row's bits do not
# depend on the pass it is in there, and a pass's attention holds every row's scores at once
STEP_CHUNK = 256
PREPACK_LIMIT_BYTES = 4 << 30  # larger models keep one copy of their dense weights (unpacked)
# per model, beside it rather than on it (a copy of the model must not carry oneDNN's opaque weights,
# which cannot be copied): its products from _fused_layers, and the compiled step's handle
_FUSED: "weakref.WeakKeyDictionary[torch.nn.Module, _Fused]" = weakref.WeakKeyDictionary()
_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, _StepHandle]" = weakref.WeakKeyDictionary()


def supports(model: torch.nn.Module) -> bool:
    """True when the lean forward reproduces this model's own forward (arch.describe: nothing it lacks)."""
    cfg = model.config
    if cfg.model_type not in LLAMA_FAMILY or describe(cfg).gaps:
        return False
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    try:
        tables = _rotary_tables(model)
    except AttributeError:
        return False
    rope_type = getattr(rotary, "rope_type", "default")
    if "dynamic" in (rope_type.values() if isinstance(rope_type, dict) else (rope_type,)) or not tables:
        return False
    layer = model.model.layers[0]
    try:
        _projections(layer)  # q/k/v and gate/up, separate or fused
    except AttributeError:
        return False
    attn, mlp = layer.self_attn, layer.mlp
    parts = [(attn, ("o_proj",)),
             (mlp, ("down_proj",)),
             (getattr(layer, "input_layernorm", None) or getattr(layer, "post_feedforward_layernorm", None), ("weight",)),
             (model.model.norm, ("weight",))]
    activation = hasattr(mlp, "act_fn") or hasattr(mlp, "activation_fn")
    return activation and all(hasattr(module, name) for module, names in parts for name in names)


def _projections(layer: torch.nn.Module) -> tuple[tuple, tuple]:
    """A layer's ((names, modules) of q/k/v, (names, modules) of gate/up): three and two modules, or one each where
    the model stores them fused (Phi-3's qkv_proj and gate_up_proj, in the same row order)."""
    attn, mlp = layer.self_attn, layer.mlp
    if hasattr(attn, "qkv_proj"):
        qkv = (("self_attn.qkv_proj",), (attn.qkv_proj,))
    else:
        qkv = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), (attn.q_proj, attn.k_proj, attn.v_proj))
    if hasattr(mlp, "gate_up_proj"):
        gate_up = (("mlp.gate_up_proj",), (mlp.gate_up_proj,))
    else:
        gate_up = (("mlp.gate_proj", "mlp.up_proj"), (mlp.gate_proj, mlp.up_proj))
    return qkv, gate_up


def _rope_kinds(model: torch.nn.Module) -> tuple[str | None, ...]:
    """The kinds of layer that have their own rotary table (Gemma 3: its local and global layers, each with its
    base), in transformers' order; (None,): one table for every layer."""
    rotary = model.model.rotary_emb
    if hasattr(rotary, "inv_freq") or not getattr(rotary, "layer_types", None):
        return (None,)
    return tuple(rotary.layer_types)


@dataclass(frozen=True)
class RotaryTable:
    """One rotary table: inverse frequencies (as many as half the rotated dimensions: fewer than half a head where
    only part of it rotates, Phi-4-mini's), the attention scaling, and for `longrope` (Phi-3.5, Phi-4-mini) the
    frequencies of the positions from `long_from` on."""

    inv_freq: torch.Tensor
    scale: float = 1.0
    long_inv_freq: torch.Tensor | None = None
    long_from: int = 0


def _rotary_tables(model: torch.nn.Module) -> list[RotaryTable]:
    """The model's rotary tables (_rope_kinds). transformers' longrope takes its long factors for every position of a
    call that reaches past the original window; here a position takes them from there on, whatever the call (the
    same for every call within the window and for steps past it)."""
    rotary = model.model.rotary_emb
    kinds = _rope_kinds(model)
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


def _norm_of(module: torch.nn.Module, offset: float = 0.0, wide: bool = False) -> Norm:
    """A transformers RMS norm module as a Norm; `offset` (Gemma's 1) is added to its weight in fp32; `wide`: the
    weight scales the fp32 rows before they are rounded (Gemma's and OLMo 2's kind)."""
    weight = module.weight.detach()
    eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
    if offset or wide:
        return Norm((weight.float() + offset).contiguous(), eps, True)
    return Norm(weight, eps)


def _wide_norms(arch) -> bool:
    """Whether the model's norms scale in fp32 before rounding (Gemma's 1 + w, OLMo 2's w)."""
    return bool(arch.norm_offset) or arch.model_type in WIDE_NORMS


def _first_norm(layer) -> Norm:
    """A layer's first norm (they share their epsilon and kind)."""
    return next(n for n in (layer.in_norm, layer.post_norm, layer.attn_out_norm, layer.mlp_out_norm) if n is not None)


def _head_norms_fit(layers: list[_Layer]) -> bool:
    """Whether the compiled step runs these per-head norms (Qwen3's, Gemma 3's): RMS norms of the kind and
    epsilon of the layers' own."""
    return all(
        layer.q_norm is not None and layer.k_norm is not None
        and layer.q_norm.eps == _first_norm(layer).eps == layer.k_norm.eps and layer.q_norm.wide == _first_norm(layer).wide
        for layer in layers
    )


def own_ops():
    """The compiled step's library where its own products run here (x86-64 with AVX2 or better, and
    SPECULA_PRODUCTS=torch not asked), or None."""
    if os.environ.get("SPECULA_PRODUCTS", "own").strip().lower() == "torch":
        return None
    ops = cpu_step.ops()
    return ops if ops is not None and ops.blocks_path(-1) >= 2 else None


class _Layer:
    """One decoder layer's products (fused q/k/v, o, fused gate/up, down) and norms."""

    def __init__(self, layer: torch.nn.Module, prefix: str, native: NativeWeights | None, prepack: bool,
                 config, arch, rope_kinds: tuple[str | None, ...]) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        (qkv_names, linears), (gate_up_names, gate_up) = _projections(layer)
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
        self.act = mlp.act_fn if hasattr(mlp, "act_fn") else mlp.activation_fn  # Phi-3 names it so
        self.gelu = arch.activation in GELU_TANH  # the gate's activation: GELU with tanh (Gemma), else SiLU
        offset, wide = arch.norm_offset, _wide_norms(arch)
        # the norms of a layer's inputs (None: the input as it is, OLMo 2's) and of its outputs (None: none)
        self.in_norm: Norm | None = None
        self.post_norm: Norm | None = None  # the MLP's input
        self.attn_out_norm: Norm | None = None
        self.mlp_out_norm: Norm | None = None
        if hasattr(layer, "pre_feedforward_layernorm"):  # Gemma's four norms: around attention and around the MLP
            self.in_norm = _norm_of(layer.input_layernorm, offset, wide)
            self.post_norm = _norm_of(layer.pre_feedforward_layernorm, offset, wide)
            self.attn_out_norm = _norm_of(layer.post_attention_layernorm, offset, wide)
            self.mlp_out_norm = _norm_of(layer.post_feedforward_layernorm, offset, wide)
        elif not hasattr(layer, "input_layernorm"):  # OLMo 2: the outputs normed, not the inputs
            self.attn_out_norm = _norm_of(layer.post_attention_layernorm, offset, wide)
            self.mlp_out_norm = _norm_of(layer.post_feedforward_layernorm, offset, wide)
        else:
            self.in_norm = _norm_of(layer.input_layernorm, offset, wide)
            self.post_norm = _norm_of(layer.post_attention_layernorm, offset, wide)
        self.rotary = bool(getattr(attn, "use_rope", True))  # SmolLM3's layers without rotary
        # each query and key head normed before rotary (Qwen3, Gemma 3), or all query heads together and all key heads
        # together (OLMo 2: norms as wide as the projections, `whole_qk_norms`)
        self.q_norm = _norm_of(attn.q_norm, offset, wide) if getattr(attn, "q_norm", None) is not None else None
        self.k_norm = _norm_of(attn.k_norm, offset, wide) if getattr(attn, "k_norm", None) is not None else None
        self.whole_qk_norms = self.q_norm is not None and self.q_norm.weight.numel() != attn.head_dim
        # a sliding-window layer sees the last `window` positions up to its own (0: all); its rotary is that of its
        # kind of layer (Gemma 3's local and global layers have their own bases): an index into rope_kinds(config)
        if hasattr(attn, "sliding_window"):  # a layer's own (Gemma 3, Ministral, Qwen2/3: None where it sees all)
            self.window = int(attn.sliding_window or 0)
        elif arch.model_type in WINDOW_EVERYWHERE:
            self.window = int(getattr(config, "sliding_window", None) or 0)
        else:
            self.window = 0
        self.rope_set = rope_kinds.index(getattr(attn, "layer_type", None)) if getattr(attn, "layer_type", None) in rope_kinds else 0
        # to see the model's weights replaced (a copy, .to(dtype or device)) after the products were built
        self._watch = tuple((p, p.data_ptr()) for p in _watched(layer))

    @property
    def products(self) -> tuple:
        return (self.qkv, self.o_proj, self.gate_up, self.down)


def _prepack(model: torch.nn.Module) -> bool:
    """Prepack dense weights for oneDNN (a second copy of them) where it applies and they are small
    enough that the copy cannot exhaust memory."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return can_prepack(model.lm_head.weight) and total <= PREPACK_LIMIT_BYTES


def _probe(layers: list[_Layer], lm_head: Dense, dtype: torch.dtype, device: torch.device) -> None:
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


def _watched(layer: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights whose replacement (a copy of the model, .to(dtype or device)) means the products are stale."""
    (_, qkv), (_, gate_up) = _projections(layer)
    return qkv[0].weight, gate_up[0].weight


def _still_fused(layers: list[_Layer], model: torch.nn.Module) -> bool:
    """False when the model's weights were replaced since fusing (a copy, .to(dtype or device))."""
    return len(layers) == len(model.model.layers) and all(
        all(p is now and p.data_ptr() == ptr for (p, ptr), now in zip(mine._watch, _watched(layer)))
        for mine, layer in zip(layers, model.model.layers)
    )


def _fused_layers(model: torch.nn.Module, native: NativeWeights | None, after_layer=None) -> tuple[list[_Layer], Dense]:
    """Build the products once per model and weight source: runners for the same model (the target,
    layer skip, a draft that is the target itself) share them. `after_layer()` runs after each layer's."""
    cached = _FUSED.get(model)
    if cached is None or cached.native is not native or not _still_fused(cached.layers, model):
        prepack = native is None and _prepack(model)  # a GGUF's own weights: no second copy for oneDNN
        layers = []
        arch, kinds = describe(model.config), _rope_kinds(model)
        for i, layer in enumerate(model.model.layers):
            layers.append(_Layer(layer, f"model.layers.{i}", native, prepack, model.config, arch, kinds))
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
    _fused_layers(model, native, after_layer)


@dataclass(frozen=True)
class _Fused:
    """A model's products, built once per weight source (`native`: the GGUF's blocks, or None)."""

    native: NativeWeights | None
    layers: list[_Layer]
    lm_head: Dense


class _StepHandle:
    """A model's products registered with the compiled step (cpu/step.py); released with the model. Where
    the file's blocks are in one of BLOCK_FORMATS, the step runs its own products over them (`Blocks`), the
    LM head's too; other weights keep the products the eager forward uses. Where only the portable path
    applies (not x86-64), or SPECULA_PRODUCTS=torch asks (to compare), torch's products stay."""

    def __init__(self, ops, layers: list[_Layer], lm_head, cfg, scale: float, native: NativeWeights | None,
                 residual: float = 1.0, softcap: float = 0.0) -> None:
        a, b, bias, names, norms, min_rows = [], [], [], [], [], []
        empty = torch.empty(0)
        own = own_ops() is not None
        per = 6 if any(layer.attn_out_norm is not None for layer in layers) else (
            4 if any(layer.q_norm is not None for layer in layers) else 2)  # norms a layer

        def tiles_apply(p) -> bool:  # bf16 weights prepacked for oneDNN, or a GGUF's own (no prepacked copy)
            return own and (p.kind == "prepacked" or (p.kind == "dense" and native is not None)) and (
                p.source.dtype == torch.bfloat16)

        for layer in layers:
            for p, parts in zip(layer.products, layer.file_parts):
                if p.kind != "blocks" and parts is not None and own:
                    p = Blocks(ops, parts, p.bias)
                elif tiles_apply(p):
                    p = Tiles(ops, p)
                names.append(p.kind)
                if p.kind == "int4":
                    a.append(p.packed), b.append(p.scale_zero)
                elif p.kind == "blocks":
                    a.append(p.packed), b.append(p.parts)
                elif p.kind in ("tiles", "tiles-plain", "tiles-unpack"):
                    a.append(p.packed), b.append(p.weight)
                else:
                    a.append(p.weight), b.append(empty)
                bias.append(p.bias)
                min_rows.append(p.stable_rows)
            norms += [n.weight if n is not None else empty for n in (layer.in_norm, layer.post_norm)]
            if per >= 4:  # Qwen3, Gemma 3: each query and key head normed before rotary
                norms += [n.weight if n is not None else empty for n in (layer.q_norm, layer.k_norm)]
            if per == 6:  # Gemma: the attention's and the MLP's outputs normed
                norms += [n.weight if n is not None else empty for n in (layer.attn_out_norm, layer.mlp_out_norm)]
        head = native.tensors.get(LM_HEAD) if native is not None else None
        if isinstance(lm_head, Blocks):  # the file's blocks already (a GGUF as it is)
            self.lm_head = lm_head
        elif own and head is not None and head.type_name in BLOCK_FORMATS:
            self.lm_head = Blocks(ops, [head], None, out_float=True)
        elif tiles_apply(lm_head):
            self.lm_head = Tiles(ops, lm_head, out_float=True)
        else:
            self.lm_head = None
        self.ops = ops
        self.layers = layers
        self.kinds = names  # each product's kind, as `products` names it
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.handle = ops.prepare(a, b, bias, [cpu_step.PRODUCT_KINDS[k] for k in names], norms, cfg.num_attention_heads,
                                  getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads, head_dim,
                                  layers[0].inter, min_rows, float(_first_norm(layers[0]).eps), float(scale),
                                  [i for i, layer in enumerate(layers) if not layer.rotary],
                                  [layer.window for layer in layers], [layer.rope_set for layer in layers],
                                  _first_norm(layers[0]).wide, layers[0].gelu, residual, softcap)

    def __del__(self) -> None:
        try:
            self.ops.release(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _whole_blocks(n: int) -> int:
    """n rounded up to whole key blocks."""
    return -(-n // _BLOCK) * _BLOCK


def _block_mask(allowed: torch.Tensor) -> tuple[int, torch.Tensor]:
    """allowed (rows, keys) -> (rows, additive fp32 mask), the mask padded to at least _MIN_ROWS rows
    (copies of the first) so every call takes the same matrix kernel."""
    rows = allowed.shape[0]
    if rows < _MIN_ROWS:
        allowed = torch.cat([allowed, allowed[:1].expand(_MIN_ROWS - rows, -1)])
    mask = torch.zeros(allowed.shape, dtype=torch.float32, device=allowed.device)
    return rows, mask.masked_fill_(~allowed, float("-inf"))


@dataclass(frozen=True)
class PrefillPlan:
    """A prompt's attention where a sliding window cuts it: the keys each row sees (T, T) bool."""

    mask: torch.Tensor


@dataclass(frozen=True)
class FusedPlan:
    """Attention through the fused kernel (GPUs): the allowed keys of each query row, or None for one
    row that sees the whole cache."""

    mask: torch.Tensor | None  # (groups*T, keys) bool


@dataclass(frozen=True)
class KeyBlock:
    """Query rows first_row..end_row-1 of a pass attend over n_keys keys (whole blocks), with an additive
    mask padded to `rows` or more rows (_block_mask)."""

    first_row: int
    end_row: int
    n_keys: int
    rows: int
    mask: torch.Tensor  # (groups*rows', n_keys) fp32


@dataclass(frozen=True)
class BlockedPlan:
    """Attention on the CPU: fp32 over whole key blocks, one call per group of rows (_attend_blocked)."""

    blocks: tuple[KeyBlock, ...]


def _call(product, x: torch.Tensor) -> torch.Tensor:
    """A product as it is, one-row kernels included (the lean forward without consistent rounding)."""
    return product(x)


def _mlp(layer, h: torch.Tensor, run) -> torch.Tensor:
    """The gated MLP of a layer over normed rows h (T, D), its output normed where the layer norms it (Gemma)."""
    gate, up = run(layer.gate_up, h).split(layer.inter, dim=-1)
    return _rms_norm(run(layer.down, layer.act(gate) * up), layer.mlp_out_norm)


def _rms_norm(x: torch.Tensor, norm: Norm | None) -> torch.Tensor:
    """transformers' RMSNorm: normalise in fp32, cast back, scale (Gemma's: scale in fp32, then cast back); None: x."""
    if norm is None:
        return x
    if norm.wide:
        return (F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps) * norm.weight).to(x.dtype)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.eps).to(x.dtype)


def _layer(runner, i: int, layer: _Layer, x: torch.Tensor, cos, sin, start: int, t: int, plans, run) -> torch.Tensor:
    """One decoder layer of the eager lean forward over rows x (T, D)."""
    attn = runner._attention(i, layer, _rms_norm(x, layer.in_norm), cos, sin, start, t, plans[layer.window], run)
    return _after_attention(runner, layer, x, attn, run)


def _after_attention(runner, layer: _Layer, x: torch.Tensor, attn: torch.Tensor, run) -> torch.Tensor:
    """The rest of a layer once its attention's output (after o_proj) is known: both residual adds and the MLP."""
    x = x + _residual(runner, _rms_norm(attn, layer.attn_out_norm))
    return x + _residual(runner, _mlp(layer, _rms_norm(x, layer.post_norm), run))


def _cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """Soft-capping: cap * tanh(x / cap)."""
    return torch.tanh(x / cap) * cap


def _capped_attention(q, k, v, allowed: torch.Tensor, scale: float, cap: float) -> torch.Tensor:
    """Attention with soft-capped scores in fp32: queries (H, T, hd) over keys and values (KV, N, hd), row r seeing
    the keys `allowed` (T, N) gives -> (H, T, hd) in q's dtype."""
    groups = q.shape[0] // k.shape[0]
    k, v = k.float().repeat_interleave(groups, 0), v.float().repeat_interleave(groups, 0)
    scores = _cap(torch.matmul(q.float(), k.transpose(1, 2)) * scale, cap)
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    return torch.matmul(scores.softmax(-1), v).to(q.dtype)


def _residual(runner, y: torch.Tensor) -> torch.Tensor:
    """A layer's attention or MLP output as it is added to the residual stream (Granite's multiplier; most: as it is)."""
    m = runner.multipliers.residual
    return y if m == 1.0 else y * m


@dataclass(frozen=True)
class Multipliers:
    """Granite's: the embeddings', each output's before the residual add, and the logits' divisor."""

    embedding: float = 1.0
    residual: float = 1.0
    logits: float = 1.0


def _multipliers(config) -> Multipliers:
    get = lambda name: float(getattr(config, name, 1.0) or 1.0)  # noqa: E731
    return Multipliers(get("embedding_multiplier"), get("residual_multiplier"), get("logits_scaling"))


class _Multiplied(torch.nn.Module):
    """An embedding whose rows are multiplied by a number, in the model's dtype (Granite's embedding multiplier)."""

    def __init__(self, embed: torch.nn.Module, multiplier: float) -> None:
        super().__init__()
        self.embed, self.multiplier = embed, multiplier

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids) * self.multiplier


class LlamaRunner:
    keeps_features = True  # features(): the last layer's hidden states of the positions held

    def __init__(self, model: torch.nn.Module, n_layers: int | None = None, native: NativeWeights | None = None,
                 step: StepMode = StepMode.EAGER, static: bool = False, graphs: bool = False,
                 floor: int = FLOOR) -> None:
        cfg = model.config
        self.model = model
        self.native = native
        # EAGER, or AUTO/COMPILED: the compiled step (cpu/step.py) where it applies and is
        # loaded, chosen at each prefill, so one answer runs in one mode from its first token to its last
        self.step = step
        self._fast: _StepHandle | None = None
        layers, self.lm_head = _fused_layers(model, native)
        self.layers = layers[: n_layers or cfg.num_hidden_layers]
        # Granite's multipliers (1 elsewhere): of the embeddings, of each layer's attention and MLP outputs before they
        # are added, and the logits' divisor
        self.multipliers = _multipliers(cfg)
        # Gemma 2's soft-capping of attention scores and of the final logits (0: none)
        self.softcap = float(getattr(cfg, "attn_logit_softcapping", None) or 0.0)
        self.final_softcap = float(getattr(cfg, "final_logit_softcapping", None) or 0.0)
        self.embed = model.model.embed_tokens
        if self.multipliers.embedding != 1.0:
            self.embed = _Multiplied(self.embed, self.multipliers.embedding)
        arch = describe(cfg)
        self.norm = _norm_of(model.model.norm, arch.norm_offset, _wide_norms(arch))
        self.vocab_size = out_features(model.lm_head)
        # logits over the first `head_rows` ids only (0: all; limit_vocab): a draft model's cut vocabulary
        self.head_rows = 0
        self._cut_head: tuple | None = None  # (the file's LM head blocks, their first head_rows outputs)
        # static (models/static.py, a GPU's step): the cache is allocated once for `max_len` positions (and a
        # scratch slot) and every step after the prefill runs in a bucket of fixed shape, at least `floor`
        # rows; with `graphs`, the buckets are captured as CUDA graphs in the background
        self.static = static
        self.floor = floor
        self.max_len = static_context(context_window(cfg)) if static else context_window(cfg)
        self.device = weight_device(model.lm_head)
        self.dtype = weight_dtype(model.lm_head)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.groups = self.n_heads // self.n_kv
        attn0 = model.model.layers[0].self_attn
        self.scale = getattr(attn0, "scaling", self.head_dim**-0.5)
        # one rotary table per kind of layer that has its own (arch.rope_kinds): (inverse frequencies, scaling)
        self._rotary = _rotary_tables(model)
        self.rotary_dims = 2 * self._rotary[0].inv_freq.shape[0]  # the dimensions of a head that rotate (all, or a part)
        self._windows = sorted({layer.window for layer in self.layers})  # 0: full attention
        self._cos = self._sin = torch.empty(0)  # (tables, capacity, head_dim)
        self._k = self._v = torch.empty(0)  # (layers, n_kv, capacity, head_dim)
        # the compiled step's keys, transposed in blocks of 16 (layers, n_kv, capacity / 16, head_dim, 16),
        # in step with _k for the first _kt_len slots
        self._kt = torch.empty(0)
        self._kt_len = 0
        self._length = 0
        self._ids = torch.empty(0, dtype=torch.long)  # the token of each position the cache holds (host memory)
        # On the CPU, attention after the prefill runs in fp32 over an fp32 cache in key blocks (see
        # _attend_blocked): faster than bf16 attention there, and every position rounds the same way
        # whatever else the pass holds. Other devices use the fused kernel in the model's dtype.
        self.blocked = self.device.type == "cpu" and not static
        self.cache_dtype = torch.float32 if self.blocked else self.dtype
        # A bf16 model's values are bf16 numbers: the compiled step keeps a bf16 copy of them (_vn, in step with
        # _v where _kt is) for single steps, which read the whole cache each (a quarter fewer bytes, the same sums)
        self.narrow_values = self.dtype == torch.bfloat16
        self._vn = torch.empty(0)
        # Consistent rounding (CPU): every position meets the same kernels whether it is decoded alone or
        # inside a verify pass; with the blocked attention, speculation then reproduces plain decoding bit
        # for bit in bf16 too. Where a product's one-row kernel rounds differently from its multi-row one
        # (F.linear; oneDNN's longer sums), a single step runs that product on two identical rows
        # (`stable_rows`, measured at load, quant.in_rows); the others give one row the bits it gets
        # among others. False gives the one-row kernels.
        self.consistent = self.blocked
        # the final hidden state (before the final norm) of every cached position, kept and rolled back
        # with the cache: the features that feature-level drafters (EAGLE, Medusa) read
        self._feat = torch.empty(0)
        # the hidden states entering these layers, kept per position beside the cache (EAGLE-3 heads read a
        # low, a middle and a high one; `keep_layers`): (capacity, len(aux_layers), D)
        self.aux_layers: tuple[int, ...] = ()
        self._aux = torch.empty(0)
        self.graphs: StepGraphs | None = None
        if static:
            self._reserve(self.max_len)
            if graphs:
                self.graphs = StepGraphs(self._static_step, self._idle_inputs, self._buffers,
                                         tuple(b for b in BUCKETS if b >= floor) or BUCKETS[-1:], self.device)
                self.graphs.start()

    def _scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """fp32 logits divided by the model's logits scaling (Granite's), or soft-capped (Gemma 2's); most: as they are."""
        if self.multipliers.logits != 1.0:
            logits = logits / self.multipliers.logits
        return _cap(logits, self.final_softcap) if self.final_softcap else logits

    @property
    def exact_trees(self) -> bool:
        """Whether a token tree's pass decides as a chain pass would. On a CPU it does while the current answer
        runs through the compiled step: every product gives a row its own bits, and a tree row's attention
        takes its keys in the chain's order (docs/ENGINE.md, "Attention"; tested against single steps). The
        eager forward's does not, in bf16 or fp32: a node's keys sit among its siblings', its attention sums
        run in another order and a near tie can tip (seen in fp32 on a tiny model: a margin of 5 ulps between
        the two best logits); nor do static steps' (a GPU's). There tree drafters send their best chain."""
        if self.static:
            return False
        return not self.blocked or self._fast is not None

    def shallow(self, n_layers: int) -> "LlamaRunner":
        return LlamaRunner(self.model, n_layers, self.native, self.step, self.static, self.graphs is not None,
                           self.floor)

    @property
    def compiled(self) -> bool:
        """Whether the current answer runs through the compiled step."""
        return self._fast is not None

    @property
    def own_products(self) -> bool:
        """Whether the current answer's step runs the own products (over the file's blocks or bf16 weights)."""
        return self._fast is not None and (self._fast.lm_head is not None or bool({"blocks", "tiles", "tiles-plain", "tiles-unpack"} & set(self._fast.kinds)))

    @property
    def step_kind(self) -> str:
        """The step the current answer runs (chosen when it starts): "compiled", "static" or "eager"; plain
        steps' times are comparable within one kind only (the live speedup's samples)."""
        return "compiled" if self._fast is not None else "static" if self.static else "eager"

    def _compiled_step(self) -> _StepHandle | None:
        """The compiled step for this model, where it is loaded and reproduces what this runner needs:
        the CPU's blocked attention with consistent rounding (Qwen3's per-head norms included). Products that
        round a lone row differently run a single step as two rows there too."""
        if self.step == StepMode.EAGER or not (self.blocked and self.consistent):
            return None
        if self.layers and self.layers[0].q_norm is not None and not _head_norms_fit(self.layers):
            return None
        ops = cpu_step.ops()
        if ops is None:
            return None
        layers, _ = _fused_layers(self.model, self.native)
        cached = _STEPS.get(self.model)
        if cached is None or cached.layers is not layers or cached.ops is not ops:
            cached = _StepHandle(ops, layers, self.lm_head, self.model.config, self.scale, self.native,
                                 self.multipliers.residual, self.softcap)
            _STEPS[self.model] = cached
            if self.native is not None and self.native.file is not None:
                self.native.file.release()  # a GGUF's pages the step's products were made from: given back
        return cached

    @property
    def length(self) -> int:
        return self._length

    def truncate(self, length: int) -> None:
        self._length = min(self._length, max(0, length))
        self._kt_len = min(self._kt_len, self._length)

    def reusable(self, ids: torch.Tensor) -> int:
        """How many leading positions of the prompt `ids` (T,) the cache already holds as reading it anew would
        write them: the tokens it shares with what the cache holds, short of the prompt's last (read for its
        logits). Only where every position's bits are those of single steps whatever pass wrote them (the
        compiled step, prompts through it too: `prompt_through_step`); elsewhere 0."""
        held = min(self._length, ids.shape[0] - 1)
        fast = self._fast
        if held <= 0 or fast is None or self.static or fast is not self._compiled_step() or not prompt_through_step(fast, self.dtype):
            return 0
        differ = torch.nonzero(self._ids[:held] != ids[:held].cpu())
        return int(differ[0, 0]) if differ.numel() else held

    def _reserve(self, needed: int) -> None:
        if needed > self.max_len:
            window = context_window(self.model.config)
            held = ("the model's window" if self.max_len == window else
                    f"the {window}-token window's first positions, which a static cache holds (SPECULA_CONTEXT)")
            raise ContextTooLongError(f"context of {needed} tokens exceeds {held}: {self.max_len}")
        capacity = self._k.shape[2] if self._k.ndim == 4 else 0
        if needed <= capacity:
            return
        if self.static:  # once, for good: the whole context and the scratch slot
            new_cap = self.max_len + 1
        else:
            new_cap = min(self.max_len, max(needed, 2 * capacity, _GROW))
            new_cap = _whole_blocks(new_cap)  # whole key blocks (positions past the window stay unused)
        shape = (len(self.layers), self.n_kv, new_cap, self.head_dim)
        k = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.cache_dtype, device=self.device)
        if capacity:
            k[:, :, : self._length] = self._k[:, :, : self._length]
            v[:, :, : self._length] = self._v[:, :, : self._length]
        self._k, self._v = k, v
        ids = torch.zeros(new_cap, dtype=torch.long)
        ids[: self._length] = self._ids[: self._length]
        self._ids = ids
        feat = torch.zeros((new_cap, self.model.config.hidden_size), dtype=self.dtype, device=self.device)
        if capacity:
            feat[: self._length] = self._feat[: self._length]
        self._feat = feat
        aux = torch.zeros((new_cap, len(self.aux_layers), feat.shape[1]), dtype=self.dtype, device=self.device)
        if capacity and self._aux.shape[1:] == aux.shape[1:]:
            aux[: self._length] = self._aux[: self._length]
        self._aux = aux
        # rotary tables for every position the cache can hold, computed in fp32 as transformers does, one per kind
        # of layer with its own (tables, cap, head_dim)
        pos = torch.arange(new_cap, device=self.device, dtype=torch.float32)
        cos32, sin32 = [], []
        half = self.rotary_dims // 2
        for table in self._rotary:
            freqs = torch.outer(pos, table.inv_freq.float().to(self.device))  # (cap, rotated/2)
            if table.long_inv_freq is not None:
                late = pos[table.long_from :]
                freqs[table.long_from :] = torch.outer(late, table.long_inv_freq.float().to(self.device))
            emb = torch.cat((freqs, freqs), dim=-1)  # (cap, rotated dims)
            cos32.append(emb.cos() * table.scale)
            sin = emb.sin() * table.scale
            # rotate_half(x) * sin == roll(x, half) * [-sin | sin] bit for bit, in two fewer operations
            sin32.append(torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))
        self._cos = torch.stack(cos32).to(self.dtype)
        self._sin = torch.stack(sin32).to(self.dtype)
        # the compiled step's tables: fp32, not rounded to the model's dtype
        self._cos32 = torch.stack(cos32).contiguous()
        self._sin32 = torch.stack(sin32).contiguous()

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last: int = 1, tree: TokenTree | None = None) -> torch.Tensor:
        """tokens (T,) -> fp32 logits (last, V). With a `tree` the tokens are its rows: row 0 continues the
        cache, every other row its parent row; each row sees the cache and its own ancestors, at the
        position of its depth. Afterwards `keep()` keeps one root-to-node path."""
        if self.graphs is not None:
            with self.graphs.recording:  # not while a graph is being recorded (a moment, once per bucket)
                return self._vocab_cut(self._forward(tokens, last, tree))
        return self._vocab_cut(self._forward(tokens, last, tree))

    def _forward(self, tokens: torch.Tensor, last: int, tree: TokenTree | None) -> torch.Tensor:
        t = tokens.shape[0]
        start = self._length
        end = start + t
        self._reserve(end)
        self._ids[start:end] = tokens.cpu()
        if start == 0:  # a new answer: it runs in one mode throughout
            self._fast = self._compiled_step()
        if tree is not None and (start == 0 or len(tree) != t):
            raise ValueError("a tree continues a non-empty cache, one row per token")
        if self._fast is not None and (start > 0 or t == 1 or prompt_through_step(self._fast, self.dtype)):
            if t > STEP_CHUNK and tree is None:
                return self._forward_in_chunks(tokens, last, start)
            return self._forward_compiled(tokens, last, tree, start, t)
        rows = bucket(t, self.floor) if self.static and start > 0 else None
        if rows is not None:
            return self._forward_static(tokens, last, tree, start, rows)
        self._kt_len = min(self._kt_len, start)  # the eager pass writes _k only
        run = in_rows if self.consistent else _call
        x = self.embed(tokens.to(self.device))  # (rows, D)
        if tree is None:
            cos = self._cos[:, start:end]  # (tables, T, hd)
            sin = self._sin[:, start:end]
            plans = {window: self._plan(start, t, window) for window in self._windows}
        else:
            depths = tree.depths(self.device)
            positions = start + depths  # (T,)
            cos = self._cos[:, positions]
            sin = self._sin[:, positions]
            ancestors = tree.ancestors(self.device)
            plans = {window: self._tree_plan(start, ancestors, depths, window) for window in self._windows}
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:
                self._aux[start:end, self.aux_layers.index(i)] = x
            x = _layer(self, i, layer, x, cos, sin, start, t, plans, run)
        self._length = end
        self._feat[start:end] = x
        return self._scaled(run(self.lm_head, _rms_norm(x[-last:], self.norm)).float())  # (last, V)

    def _forward_compiled(self, tokens: torch.Tensor, last: int, tree: TokenTree | None, start: int, t: int):
        """The layer loop in one call of the compiled step (a prompt of several tokens stays eager, one causal
        attention kernel over the whole prompt and dense products for long ones, except where
        `prompt_through_step`)."""
        end = start + t
        x = self.embed(tokens.to(self.device))
        if tree is None:
            pos, ancestors = torch.arange(start, end), None
        else:
            pos, ancestors = start + tree.depths(self.device), tree.ancestors(self.device)
        fast = self._fast
        self._step_copies()
        aux = self._aux[start:end] if self.aux_layers else None
        x = fast.ops.forward(fast.handle, x, self._k, self._v, self._kt, self._kt_len, self._cos32, self._sin32, pos,
                             start, ancestors, len(self.layers), aux, list(self.aux_layers), self._vn)
        self._length = end
        self._kt_len = end
        self._feat[start:end] = x
        h = fast.ops.rms_norm(x[-last:], self.norm.weight, self.norm.eps, self.norm.wide)
        return self._scaled(in_rows(self._head(self.lm_head if fast.lm_head is None else fast.lm_head), h).float())

    def limit_vocab(self, n: int) -> None:
        """Logits over the ids below n only (0: all of them): a draft model drafting from the tokens its target
        mostly emits. A byte-pair vocabulary numbers its tokens in the order their merges were learned, most
        frequent first, so the lowest ids are the common ones. Where the LM head is a file's blocks, only those
        rows are read (the 0.5B Qwen2.5's head over 151,936 ids is over a third of the bytes a step reads);
        elsewhere the logits are cut after the product. n is rounded up to a whole tile of the packed head."""
        n = max(0, int(n))
        self.head_rows = 0 if n == 0 or n >= self.vocab_size else min(self.vocab_size, -(-n // TILE_COLS) * TILE_COLS)
        self._cut_head = None

    def _head(self, product):
        """The LM head product a pass runs: a file's blocks cut to their first head_rows outputs (limit_vocab);
        any other head as it is (forward cuts its logits)."""
        if not self.head_rows or not isinstance(product, Blocks):
            return product
        if self._cut_head is None or self._cut_head[0] is not product:
            try:
                cut = product.first_rows(self.head_rows)
            except ValueError:  # a head of several parts or with a bias: cut after the product
                cut = product
            self._cut_head = (product, cut)
        return self._cut_head[1]

    def _vocab_cut(self, logits: torch.Tensor) -> torch.Tensor:
        """(rows, V) -> (rows, head_rows) where the vocabulary is cut and the product gave every id."""
        return logits[:, : self.head_rows] if self.head_rows and logits.shape[-1] > self.head_rows else logits

    def _forward_in_chunks(self, tokens: torch.Tensor, last: int, start: int) -> torch.Tensor:
        """A long pass (a prompt) through the compiled step as passes of STEP_CHUNK rows, one after the other:
        the same bits as one pass (each row's arithmetic depends on its own row and the cache before it)."""
        t = tokens.shape[0]
        first_kept = t - last  # the rows whose logits are returned
        logits = []
        for s in range(0, t, STEP_CHUNK):
            n = min(STEP_CHUNK, t - s)
            kept = s + n - max(s, first_kept)
            out = self._forward_compiled(tokens[s : s + n], max(1, kept), None, start + s, n)
            if kept > 0:
                logits.append(out)
        return torch.cat(logits)

    def _forward_static(self, tokens: torch.Tensor, last: int, tree: TokenTree | None, start: int, rows: int):
        """A pass after the prefill as a step of `rows` rows (models/static.py), through its graph where captured."""
        t = tokens.shape[0]
        host = torch.device("cpu")  # the inputs are made on the host, then copied to the device
        depths, ancestors = (None, None) if tree is None else (tree.depths(host), tree.ancestors(host))
        inputs = step_inputs(self.max_len, rows, tokens, start, host, depths, ancestors)
        replayed = self.graphs.run(rows, inputs) if self.graphs is not None else None
        if replayed is not None:
            logits = replayed[t - last : t].clone()  # the graph writes its buffer again at its next replay
        else:
            logits = self._static_step(inputs.to(self.device))[t - last : t]
        self._length = start + t
        return logits

    def _static_step(self, inp: StepInputs) -> torch.Tensor:
        """The layer loop of one step of fixed shape over the static cache: writes the rows' keys, values,
        features (and kept layers' states) to their slots; fp32 logits of every row (R, V). Tensor operations
        of fixed shapes only, without a host synchronisation: a CUDA graph can record it."""
        rows = inp.tokens.shape[0]
        keys = self._k.shape[2]
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        x = self.embed(inp.tokens)
        cos, sin = self._cos[:, inp.positions], self._sin[:, inp.positions]
        # row r sees the slots before `start`, its ancestors' slots in this pass (in a sliding-window layer those
        # within the window of its position), and slot 0 where it sees nothing else (a padding row)
        allowed = (torch.arange(keys, device=x.device) < inp.start).expand(rows, keys).clone()
        allowed.scatter_(1, inp.slots.expand(rows, rows), inp.ancestors)
        masks = {}
        for window in self._windows:
            seen = allowed
            if window:
                seen = seen & (torch.arange(keys, device=x.device)[None, :] > inp.positions[:, None] - window)
            seen = seen.clone()
            seen[:, 0] |= ~seen.any(1)
            masks[window] = seen.repeat(self.groups, 1)  # (groups*R, keys): grouped queries as extra rows of their KV head
        for i, layer in enumerate(self.layers):
            if i in self.aux_layers:
                self._aux[:, self.aux_layers.index(i)].index_copy_(0, inp.slots, x)
            q, k, v = self._project(layer, _rms_norm(x, layer.in_norm), cos, sin, _call)
            self._k[i].index_copy_(1, inp.slots, k)
            self._v[i].index_copy_(1, inp.slots, v)
            if self.softcap:
                out = _capped_attention(q, self._k[i], self._v[i], masks[layer.window][:rows], self.scale, self.softcap)
            else:
                out = F.scaled_dot_product_attention(q.reshape(kv, self.groups * rows, hd), self._k[i], self._v[i],
                                                     attn_mask=masks[layer.window], scale=self.scale).view(h, rows, hd)
            x = _after_attention(self, layer, x, layer.o_proj(out.transpose(0, 1).reshape(rows, -1)), _call)
        self._feat.index_copy_(0, inp.slots, x)
        return self._scaled(self.lm_head(_rms_norm(x, self.norm)).float())

    def _idle_inputs(self, rows: int) -> StepInputs:
        """A step of padding rows only (they write the scratch slot): what graphs are captured on."""
        return step_inputs(self.max_len, rows, torch.zeros(0, dtype=torch.long), 0, self.device)

    def _buffers(self) -> tuple:
        """What a captured step reads and writes: the buffers by identity, and the layers whose states it keeps."""
        return (self.aux_layers, self._k, self._v, self._feat, self._aux, self._cos, self._sin)

    def _step_copies(self) -> None:
        """The compiled step's transposed keys and bf16 values, allocated again (and filled from _k and _v) when the
        cache grew."""
        narrow = self._v.shape if self.narrow_values else (0,)
        if self._kt.numel() != self._k.numel() or self._vn.shape != narrow:
            layers, kv, cap, hd = self._k.shape
            self._kt = torch.zeros((layers, kv, cap // 16, hd, 16), dtype=torch.float32, device=self.device)
            self._vn = torch.zeros(narrow, dtype=torch.bfloat16, device=self.device)
            self._kt_len = 0

    def keep_layers(self, layers: tuple[int, ...]) -> None:
        """From the next prompt on, keep the hidden states entering these layers for every position
        (`aux_features`); () keeps none."""
        layers = tuple(sorted(set(int(i) for i in layers)))
        if any(not 0 <= i < len(self.layers) for i in layers):
            raise ValueError(f"layers {layers} are not all among the model's {len(self.layers)}")
        if layers != self.aux_layers:
            self.aux_layers = layers
            self._length = self._kt_len = 0  # the cache holds no such states yet: read again from the start
            self._aux = torch.zeros((self._feat.shape[0], len(layers), self._feat.shape[-1] if self._feat.ndim == 2 else 0),
                                    dtype=self.dtype, device=self.device)
            if self.graphs is not None:  # the captured steps wrote the old buffer
                self.graphs.start()

    def aux_features(self, start: int, end: int) -> torch.Tensor:
        """The kept layers' hidden states of cached positions start..end-1, side by side in layer order
        (end-start, len(aux_layers) * D)."""
        if not 0 <= start <= end <= self._length:
            raise ValueError(f"positions {start}..{end} are not all in the cache of {self._length}")
        return self._aux[start:end].reshape(end - start, -1)

    def features(self, start: int, end: int) -> torch.Tensor:
        """The final hidden states (before the final norm) of cached positions start..end-1, (end-start, D)."""
        if not 0 <= start <= end <= self._length:
            raise ValueError(f"positions {start}..{end} are not all in the cache of {self._length}")
        return self._feat[start:end]

    @torch.inference_mode()
    def keep(self, start: int, rows: list[int]) -> None:
        """After a tree pass that began at `start`: keep the rows `rows` (a root-to-node path, row 0 first)
        as positions start, start+1, ...; drop the rest."""
        index = torch.tensor(rows, device=self.device)
        if rows != list(range(len(rows))):
            target = torch.arange(start, start + len(rows), device=self.device)
            self._k[:, :, target] = self._k[:, :, start + index]
            self._v[:, :, target] = self._v[:, :, start + index]
            self._feat[target] = self._feat[start + index]
            self._ids[start : start + len(rows)] = self._ids[start + index.cpu()]
            if self.aux_layers:
                self._aux[target] = self._aux[start + index]
            self._kt_len = min(self._kt_len, start)
        self._length = start + len(rows)
        self._kt_len = min(self._kt_len, self._length)  # the dropped rows' slots are rewritten later

    def _tree_plan(self, start: int, ancestors: torch.Tensor, depths: torch.Tensor, window: int = 0):
        """Masks for a tree pass: every row sees the cache before `start` and its own ancestors (with a `window`,
        those among them within it of the row's position)."""
        t = ancestors.shape[0]
        dev = self.device
        n_keys = _whole_blocks(start + t) if self.blocked else start + t
        allowed = torch.zeros((t, n_keys), dtype=torch.bool, device=dev)
        allowed[:, :start] = True
        allowed[:, start : start + t] = ancestors
        if window:
            positions = torch.arange(n_keys, device=dev)
            positions[start : start + t] = start + depths
            allowed &= positions[None, :] > (start + depths)[:, None] - window
        allowed = allowed.repeat(self.groups, 1)  # (groups*T, n_keys)
        if not self.blocked:
            return FusedPlan(allowed)
        rows, mask = _block_mask(allowed)
        return BlockedPlan((KeyBlock(0, t, n_keys, rows, mask),))

    def _plan(self, start: int, t: int, window: int = 0) -> PrefillPlan | FusedPlan | BlockedPlan | None:
        """How this pass attends: None for the prefill's causal kernel (a mask where a sliding `window` cuts it);
        otherwise, on the CPU, the key blocks of its row groups; elsewhere a mask for the fused kernel."""
        end = start + t
        dev = self.device

        def seen(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:  # (queries, keys) bool
            allowed = keys[None, :] <= queries[:, None]
            return allowed & (keys[None, :] > queries[:, None] - window) if window else allowed

        if start == 0 and t > 1:
            if window and t > window:
                return PrefillPlan(seen(torch.arange(t, device=dev), torch.arange(t, device=dev)))
            return None
        if not self.blocked:
            if t == 1 and not (window and end > window):
                return FusedPlan(None)
            keys = torch.arange(end, device=dev)
            queries = torch.arange(start, end, device=dev)
            return FusedPlan(seen(keys, queries).repeat(self.groups, 1))  # (groups*T, end)
        groups = []
        r0 = 0
        while r0 < t:  # rows whose own key count rounds up to the same block count form one group
            n_keys = _whole_blocks(start + r0 + 1)
            r1 = min(t, n_keys - start)
            keys = torch.arange(n_keys, device=dev)
            queries = torch.arange(start + r0, start + r1, device=dev)
            allowed = seen(keys, queries).repeat(self.groups, 1)  # (groups*Tg, n_keys)
            rows, mask = _block_mask(allowed)
            groups.append(KeyBlock(r0, r1, n_keys, rows, mask))
            r0 = r1
        return BlockedPlan(tuple(groups))

    def _project(self, layer: _Layer, x: torch.Tensor, cos, sin, run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed rows (T, D) -> queries (H, T, hd), keys and values (KV, T, hd), rotary applied."""
        t = x.shape[0]
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        flat = run(layer.qkv, x)
        if layer.whole_qk_norms:  # OLMo 2: all query heads normed together, and all key heads
            flat = torch.cat((_rms_norm(flat[:, : h * hd], layer.q_norm), _rms_norm(flat[:, h * hd : (h + kv) * hd], layer.k_norm),
                              flat[:, (h + kv) * hd :]), dim=1)
        qkv = flat.view(t, h + 2 * kv, hd).transpose(0, 1)  # (H+2KV, T, hd)
        v = qkv[h + kv :]  # (KV, T, hd)
        if layer.q_norm is not None and not layer.whole_qk_norms:
            qk = torch.cat((_rms_norm(qkv[:h], layer.q_norm), _rms_norm(qkv[h : h + kv], layer.k_norm)))
        else:
            qk = qkv[: h + kv]
        if layer.rotary:  # rotary on queries and keys at once, with the table of the layer's kind
            cos, sin = cos[layer.rope_set], sin[layer.rope_set]
            rd = self.rotary_dims
            if rd == self.head_dim:
                qk = qk * cos + qk.roll(rd // 2, -1) * sin
            else:  # the first rd dimensions of each head rotate, the rest pass as they are (Phi-4-mini)
                rot = qk[..., :rd]
                qk = torch.cat((rot * cos + rot.roll(rd // 2, -1) * sin, qk[..., rd:]), dim=-1)
        return qk[:h], qk[h:], v

    def _attention(self, i: int, layer: _Layer, x, cos, sin, start: int, t: int, plan, run):
        end = start + t
        h, kv, hd = self.n_heads, self.n_kv, self.head_dim
        q, k, v = self._project(layer, x, cos, sin, run)
        self._k[i, :, start:end] = k
        self._v[i, :, start:end] = v
        if self.softcap and not isinstance(plan, BlockedPlan):  # Gemma 2's capped scores: no fused kernel has them
            if plan is None or isinstance(plan, PrefillPlan):
                allowed = torch.ones(t, t, dtype=torch.bool, device=q.device).tril() if plan is None else plan.mask
                out = _capped_attention(q, k, v, allowed, self.scale, self.softcap)
            else:
                allowed = torch.ones(t, end, dtype=torch.bool, device=q.device) if plan.mask is None else plan.mask[:t]
                out = _capped_attention(q, self._k[i, :, :end], self._v[i, :, :end], allowed, self.scale, self.softcap)
            return run(layer.o_proj, out.transpose(0, 1).reshape(t, -1))
        if plan is None:  # prefill: plain causal attention, the fused kernel applies
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=self.scale, enable_gqa=True)
            return run(layer.o_proj, out[0].transpose(0, 1).reshape(t, -1))
        if isinstance(plan, PrefillPlan):  # prefill of a sliding-window layer longer than its window
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=plan.mask, scale=self.scale,
                                                 enable_gqa=True)
            return run(layer.o_proj, out[0].transpose(0, 1).reshape(t, -1))
        if isinstance(plan, BlockedPlan):
            out = torch.cat([self._attend_blocked(i, q[:, b.first_row:b.end_row], b) for b in plan.blocks], dim=1)
        else:
            # grouped-query attention without copying K/V: the query heads that share a KV head
            # become extra query rows of that head, (H, T, hd) -> (KV, groups*T, hd)
            out = F.scaled_dot_product_attention(
                q.reshape(kv, self.groups * t, hd), self._k[i, :, :end], self._v[i, :, :end], attn_mask=plan.mask,
                scale=self.scale
            ).view(h, t, hd)
        out = out.transpose(0, 1).reshape(t, -1)  # (H, T, hd) -> (T, H*hd)
        return run(layer.o_proj, out)

    def _attend_blocked(self, i: int, q: torch.Tensor, block: KeyBlock) -> torch.Tensor:
        """Query rows (H, Tg, hd) over whole key blocks in fp32, later keys masked -> (H, Tg, hd).
        A row's result depends only on its own key count (rounded up to a block) and not on the other
        rows in the call, so a verify pass and single steps produce the same bits."""
        n_keys, rows, mask = block.n_keys, block.rows, block.mask
        tg = q.shape[1]
        q = (q.float() * self.scale).reshape(self.n_kv, rows, self.head_dim)
        if mask.shape[0] > rows:
            q = torch.cat([q, q[:, :1].expand(-1, mask.shape[0] - rows, -1)], dim=1)
        if self.softcap:  # Gemma 2: each score capped, cap * tanh(score / cap), before the mask
            scores = _cap(torch.bmm(q, self._k[i, :, :n_keys].transpose(1, 2)), self.softcap) + mask
        else:
            scores = torch.baddbmm(mask, q, self._k[i, :, :n_keys].transpose(1, 2))  # (KV, rows', n_keys)
        out = torch.bmm(scores.softmax(-1), self._v[i, :, :n_keys])[:, :rows]  # (KV, rows, hd)
        return out.to(self.dtype).reshape(self.n_heads, tg, self.head_dim)


def prompt_through_step(fast: _StepHandle, dtype: torch.dtype) -> bool:
    """Whether a prompt (a pass at an empty cache) runs through the compiled step rather than the eager forward:
    where the step's products are all the file's own blocks, on every CPU. Without oneDNN's bf16 kernels (AMD
    before Zen 4, Intel Core) a prompt of up to 1,000 tokens reads five to nine times as fast so; with them (AVX-512
    BF16) the step read 60 tokens in a third of the eager forward's time, 300 in 0.69 of it, 1,000 in 0.87, 4,000
    in 0.97 and 7,000 in the same (docs/bench/history/2026-12-05.md, "Prompts through the compiled step on every CPU"). And a
    prompt's positions then hold the bits that steps would give them."""
    return dtype == torch.bfloat16 and set(fast.kinds) == {"blocks"}


@torch.inference_mode()
def step_rows(runners: list[LlamaRunner], tokens: torch.Tensor) -> torch.Tensor:
    """One decoding step of several independent answers at once (batched plain decoding): token b (B,)
    continues runners[b]'s sequence, and row b of the fp32 logits (B, V) is what runners[b].forward(tokens[b:b+1])
    gives. Every runner holds a prompt of the same model and runs its answer through the compiled step; the
    products run once for all rows (the own products give a row its bits whatever else the call holds), and
    each row attends over its own cache."""
    if not runners or len(runners) != tokens.shape[0]:
        raise ValueError(f"one token per runner: {tokens.shape[0]} tokens for {len(runners)} runners")
    fast = runners[0]._fast
    layers = runners[0].aux_layers
    if fast is None or any(r._fast is not fast or r.length == 0 or r.aux_layers != layers for r in runners):
        raise ValueError("batched steps need runners of one model, each past its prompt, in the compiled step, "
                         "keeping the same layers' states")
    for r in runners:
        r._reserve(r._length + 1)
        r._step_copies()
    first = runners[0]
    x = first.embed(tokens.to(first.device))
    aux = torch.empty((x.shape[0], len(layers), x.shape[1]), dtype=x.dtype, device=x.device) if layers else None
    x = fast.ops.forward_rows(fast.handle, x, [r._k for r in runners], [r._v for r in runners], [r._kt for r in runners],
                              [r._kt_len for r in runners], [r._cos32 for r in runners], [r._sin32 for r in runners],
                              [r._length for r in runners], len(first.layers), [r._vn for r in runners], aux, list(layers))
    for b, r in enumerate(runners):
        if aux is not None:
            r._aux[r._length] = aux[b]
        r._feat[r._length] = x[b]
        r._ids[r._length] = tokens[b].cpu()
        r._length += 1
        r._kt_len = r._length
    h = fast.ops.rms_norm(x, first.norm.weight, first.norm.eps, first.norm.wide)
    return first._scaled(in_rows(first.lm_head if fast.lm_head is None else fast.lm_head, h).float())
