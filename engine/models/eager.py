"""The lean forward's eager pass: the layer loop in torch operations over the products of `layers.py`, attention by
attention.py's plans over the runner's cache (cache.py). What the compiled step (compiled.py) and a GPU's static steps
(static.py) are checked against, and what answers where neither applies. `project` (queries, keys and values with
their norms and rotary) is the static step's too."""

from __future__ import annotations

import torch

from ..cpu.products import in_rows
from ..decoding.tree import TokenTree
from .attention import Plan, pass_plan, tree_plan
from .block import after_attention, call, rms_norm
from .layers import LayerWeights


def forward_eager(runner, tokens: torch.Tensor, last: int, tree: TokenTree | None, start: int) -> torch.Tensor:
    """A pass of `tokens` from position `start` (a chain, or the rows of `tree`) -> fp32 logits of its last `last`
    rows; its keys, values and states written to the runner's cache."""
    cache = runner.cache
    t = tokens.shape[0]
    end = start + t
    cache.held(start)  # the eager pass writes k and v only: the compiled step's copies are in step up to start
    run = in_rows if runner.consistent else call
    x = runner.embed(tokens.to(runner.device))  # (rows, D)
    if tree is None:
        cos = cache.cos[:, start:end]  # (tables, T, hd)
        sin = cache.sin[:, start:end]
        plans = {w: pass_plan(start, t, w, runner.groups, runner.blocked, runner.device) for w in runner.windows}
    else:
        depths = tree.depths(runner.device)
        positions = start + depths  # (T,)
        cos = cache.cos[:, positions]
        sin = cache.sin[:, positions]
        ancestors = tree.ancestors(runner.device)
        plans = {w: tree_plan(start, ancestors, depths, w, runner.groups, runner.blocked, runner.device) for w in runner.windows}
    for i, layer in enumerate(runner.layers):
        if i in cache.aux_layers:
            cache.aux[start:end, cache.aux_layers.index(i)] = x
        attn = attention(runner, i, layer, rms_norm(x, layer.norms["attn_in"]), cos, sin, start, t, plans[layer.window], run)
        x = after_attention(runner, layer, x, attn, run)
    cache.held(end)
    cache.feat[start:end] = x
    return runner.scaled(run(runner.lm_head, rms_norm(x[-last:], runner.norm)).float())  # (last, V)


def project(runner, layer: LayerWeights, x: torch.Tensor, cos, sin, run) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Normed rows (T, D) -> queries (H, T, hd), keys and values (KV, T, hd), rotary applied."""
    t = x.shape[0]
    h, kv, hd = runner.n_heads, runner.n_kv, runner.head_dim
    flat = run(layer.qkv, x)
    if layer.whole_qk_norms:  # OLMo 2: all query heads normed together, and all key heads
        flat = torch.cat((rms_norm(flat[:, : h * hd], layer.q_norm), rms_norm(flat[:, h * hd : (h + kv) * hd], layer.k_norm),
                          flat[:, (h + kv) * hd :]), dim=1)
    qkv = flat.view(t, h + 2 * kv, hd).transpose(0, 1)  # (H+2KV, T, hd)
    v = qkv[h + kv :]  # (KV, T, hd)
    if layer.q_norm is not None and not layer.whole_qk_norms:
        qk = torch.cat((rms_norm(qkv[:h], layer.q_norm), rms_norm(qkv[h : h + kv], layer.k_norm)))
    else:
        qk = qkv[: h + kv]
    if layer.rotary:  # rotary on queries and keys at once, with the table of the layer's kind
        cos, sin = cos[layer.rope_set], sin[layer.rope_set]
        rd = runner.cache.rotary_dims
        if rd == hd:
            qk = qk * cos + qk.roll(rd // 2, -1) * sin
        else:  # the first rd dimensions of each head rotate, the rest pass as they are (Phi-4-mini)
            rot = qk[..., :rd]
            qk = torch.cat((rot * cos + rot.roll(rd // 2, -1) * sin, qk[..., rd:]), dim=-1)
    return qk[:h], qk[h:], v


def attention(runner, i: int, layer: LayerWeights, x, cos, sin, start: int, t: int, plan: Plan, run):
    """A layer's attention over normed rows x (T, D), its keys and values written to the cache, by the pass's plan
    -> the output projection's rows (T, D)."""
    end = start + t
    q, k, v = project(runner, layer, x, cos, sin, run)
    keys, values = runner.cache.k[i], runner.cache.v[i]
    keys[:, start:end] = k
    values[:, start:end] = v
    out = plan.attend(runner.heads, q, k, v, keys, values, end)  # (H, T, hd)
    return run(layer.o_proj, out.transpose(0, 1).reshape(t, -1))
