"""The lean forward's passes through the compiled step (cpu/step.py): a model's layers registered with it once, as
one table of named per-layer fields, and the passes that run the whole layer loop in one call."""

from __future__ import annotations

import weakref

import torch

from ..cpu import step as cpu_step
from ..cpu.products import BLOCK_FORMATS, Blocks, Tiles, in_rows
from ..decoding.tree import TokenTree
from .families import Spec
from .gguf import LM_HEAD, NativeWeights
from .layers import LayerWeights, first_norm, fused_layers, own_ops

# Passes through the compiled step of more rows than this (prompts) run as passes of this many: a row's bits do not
# depend on the pass it is in there, and a pass's attention holds every row's scores at once
STEP_CHUNK = 256
# per model, beside it rather than on it: the compiled step's handle
_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, StepHandle]" = weakref.WeakKeyDictionary()
_EMPTY = torch.empty(0)


class StepHandle:
    """A model's products registered with the compiled step (cpu/step.py); released with the model. Where
    the file's blocks are in one of BLOCK_FORMATS, the step runs its own products over them (`Blocks`), the
    LM head's too; other weights keep the products the eager forward uses. Where only the portable path
    applies (not x86-64), or SPECULA_PRODUCTS=torch asks (to compare), torch's products stay."""

    def __init__(self, ops, layers: list[LayerWeights], lm_head, spec: Spec, native: NativeWeights | None) -> None:
        own = own_ops() is not None

        def tiles_apply(p) -> bool:  # bf16 weights prepacked for oneDNN, or a GGUF's own (no prepacked copy)
            return own and (p.kind == "prepacked" or (p.kind == "dense" and native is not None)) and (
                p.source.dtype == torch.bfloat16)

        def step_form(p, parts):
            if p.kind != "blocks" and parts is not None and own:
                return Blocks(ops, parts, p.bias)
            return Tiles(ops, p) if tiles_apply(p) else p

        weight = lambda norm: None if norm is None else norm.weight  # noqa: E731
        table = []
        for layer in layers:
            products = tuple(step_form(p, parts) for p, parts in zip(layer.products, layer.file_parts))
            norms = {slot: weight(norm) for slot, norm in layer.norms.items()}  # StepLayer's fields by these names
            table.append(cpu_step.StepLayer(products, q_norm=weight(layer.q_norm), k_norm=weight(layer.k_norm),
                                            rotary=layer.rotary, window=layer.window, rope_set=layer.rope_set, **norms))
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
        self.kinds = [p.kind for entry in table for p in entry.products]  # each product's kind, as `products` names it
        self.products = table  # the step's products live as long as the handle
        first = first_norm(layers[0])
        model = cpu_step.StepModel(n_heads=spec.heads, n_kv=spec.kv_heads, head_dim=spec.head_dim, inter=layers[0].inter,
                                   eps=float(first.eps), scale=float(spec.attention_scale), wide_norms=first.wide,
                                   gelu=spec.gelu, residual=spec.residual_multiplier, softcap=spec.attention_softcap)
        self.handle = cpu_step.register(ops, model, table)

    def __del__(self) -> None:
        try:
            self.ops.release(self.handle)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _head_norms_fit(layers: list[LayerWeights]) -> bool:
    """Whether the compiled step runs these per-head norms (Qwen3's, Gemma 3's): RMS norms of the kind and
    epsilon of the layers' own."""
    return all(
        layer.q_norm is not None and layer.k_norm is not None
        and layer.q_norm.eps == first_norm(layer).eps == layer.k_norm.eps and layer.q_norm.wide == first_norm(layer).wide
        for layer in layers
    )


def step_for(runner) -> StepHandle | None:
    """The compiled step for a runner's model, where it is loaded and reproduces what the runner needs: the CPU's
    blocked attention with consistent rounding (per-head norms included). Products that round a lone row
    differently run a single step as two rows there too."""
    if runner.step == cpu_step.StepMode.EAGER or not (runner.blocked and runner.consistent):
        return None
    if runner.layers and runner.layers[0].q_norm is not None and not _head_norms_fit(runner.layers):
        return None
    ops = cpu_step.ops()
    if ops is None:
        return None
    layers, _ = fused_layers(runner.model, runner.native)
    cached = _STEPS.get(runner.model)
    if cached is None or cached.layers is not layers or cached.ops is not ops:
        cached = StepHandle(ops, layers, runner.lm_head, runner.spec, runner.native)
        _STEPS[runner.model] = cached
        if runner.native is not None and runner.native.file is not None:
            runner.native.file.release()  # a GGUF's pages the step's products were made from: given back
    return cached


def prompt_through_step(fast: StepHandle, dtype: torch.dtype) -> bool:
    """Whether a prompt (a pass at an empty cache) runs through the compiled step rather than the eager forward:
    where the step's products are all the file's own blocks, on every CPU. Without oneDNN's bf16 kernels (AMD
    before Zen 4, Intel Core) a prompt of up to 1,000 tokens reads five to nine times as fast so; with them (AVX-512
    BF16) the step read 60 tokens in a third of the eager forward's time, 300 in 0.69 of it, 1,000 in 0.87, 4,000
    in 0.97 and 7,000 in the same (docs/bench/history/2026-12-05.md, "Prompts through the compiled step on every CPU"). And a
    prompt's positions then hold the bits that steps would give them."""
    return dtype == torch.bfloat16 and set(fast.kinds) == {"blocks"}


def forward_compiled(runner, tokens: torch.Tensor, last: int, tree: TokenTree | None, start: int) -> torch.Tensor:
    """The layer loop in one call of the compiled step; a pass longer than STEP_CHUNK rows (a prompt) as passes of
    that many, one after the other: the same bits as one pass (each row's arithmetic depends on its own row and the
    cache before it)."""
    t = tokens.shape[0]
    if t <= STEP_CHUNK or tree is not None:
        return _one_pass(runner, tokens, last, tree, start)
    first_kept = t - last  # the rows whose logits are returned
    logits = []
    for s in range(0, t, STEP_CHUNK):
        n = min(STEP_CHUNK, t - s)
        kept = s + n - max(s, first_kept)
        out = _one_pass(runner, tokens[s : s + n], max(1, kept), None, start + s)
        if kept > 0:
            logits.append(out)
    return torch.cat(logits)


def _one_pass(runner, tokens: torch.Tensor, last: int, tree: TokenTree | None, start: int) -> torch.Tensor:
    t = tokens.shape[0]
    end = start + t
    x = runner.embed(tokens.to(runner.device))
    if tree is None:
        pos, ancestors = torch.arange(start, end), None
    else:
        pos, ancestors = start + tree.depths(runner.device), tree.ancestors(runner.device)
    fast, cache = runner.fast, runner.cache
    cache.step_copies()
    aux = cache.aux[start:end] if cache.aux_layers else None
    x = fast.ops.forward(fast.handle, x, cache.k, cache.v, cache.kt, cache.kt_len, cache.cos32, cache.sin32,
                         pos, start, ancestors, len(runner.layers), aux, list(cache.aux_layers), cache.vn)
    cache.held(end, copies=True)
    cache.feat[start:end] = x
    h = fast.ops.rms_norm(x[-last:], runner.norm.weight, runner.norm.eps, runner.norm.wide)
    return runner.scaled(in_rows(runner.head_product(runner.lm_head if fast.lm_head is None else fast.lm_head), h).float())


@torch.inference_mode()
def step_rows(runners: list, tokens: torch.Tensor) -> torch.Tensor:
    """One decoding step of several independent answers at once (batched plain decoding): token b (B,)
    continues runners[b]'s sequence, and row b of the fp32 logits (B, V) is what runners[b].forward(tokens[b:b+1])
    gives. Every runner holds a prompt of the same model and runs its answer through the compiled step; the
    products run once for all rows (the own products give a row its bits whatever else the call holds), and
    each row attends over its own cache."""
    if not runners or len(runners) != tokens.shape[0]:
        raise ValueError(f"one token per runner: {tokens.shape[0]} tokens for {len(runners)} runners")
    fast = runners[0].fast
    layers = runners[0].aux_layers
    if fast is None or any(r.fast is not fast or r.length == 0 or r.aux_layers != layers for r in runners):
        raise ValueError("batched steps need runners of one model, each past its prompt, in the compiled step, "
                         "keeping the same layers' states")
    caches = [r.cache for r in runners]
    for c in caches:
        c.reserve(c.length + 1)
        c.step_copies()
    first = runners[0]
    x = first.embed(tokens.to(first.device))
    aux = torch.empty((x.shape[0], len(layers), x.shape[1]), dtype=x.dtype, device=x.device) if layers else None
    x = fast.ops.forward_rows(fast.handle, x, [c.k for c in caches], [c.v for c in caches], [c.kt for c in caches],
                              [c.kt_len for c in caches], [c.cos32 for c in caches], [c.sin32 for c in caches],
                              [c.length for c in caches], len(first.layers), [c.vn for c in caches], aux, list(layers))
    for b, c in enumerate(caches):
        if aux is not None:
            c.aux[c.length] = aux[b]
        c.feat[c.length] = x[b]
        c.ids[c.length] = tokens[b].cpu()
        c.held(c.length + 1, copies=True)
    h = fast.ops.rms_norm(x, first.norm.weight, first.norm.eps, first.norm.wide)
    return first.scaled(in_rows(first.lm_head if fast.lm_head is None else fast.lm_head, h).float())
