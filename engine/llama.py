"""A lean forward for the Llama family (Llama, Qwen2/3, Mistral, SmolLM) over a static KV cache.

It reuses the loaded transformers modules' weights (projections, norms, MLP) and replaces what costs on
the hot path: attention reads a preallocated cache, rollback is moving `length`, and no mask is built
for single-token steps. `shallow(n)` gives a runner over the first n layers with its own cache, sharing
the weights (early-exit self-speculation).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import ContextTooLongError

LLAMA_FAMILY = {"llama", "qwen2", "qwen3", "mistral"}
_GROW = 256  # cache capacity grows in steps of this many positions


def supports(model: torch.nn.Module) -> bool:
    """True when the lean forward reproduces this model's own forward."""
    cfg = model.config
    if cfg.model_type not in LLAMA_FAMILY:
        return False
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", "default")
    return rotary is not None and hasattr(rotary, "inv_freq") and rope_type != "dynamic"


def context_window(config) -> int:
    window = int(getattr(config, "max_position_embeddings", 2048) or 2048)
    sliding = getattr(config, "sliding_window", None)
    uses_sliding = config.model_type == "mistral" or getattr(config, "use_sliding_window", False)
    if sliding and uses_sliding:
        window = min(window, int(sliding))  # within the window, full attention is exact
    return window


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaRunner:
    def __init__(self, model: torch.nn.Module, n_layers: int | None = None) -> None:
        cfg = model.config
        self.model = model
        self.layers = list(model.model.layers)[: n_layers or cfg.num_hidden_layers]
        self.embed = model.model.embed_tokens
        self.norm = model.model.norm
        self.lm_head = model.lm_head
        self.vocab_size = self.lm_head.weight.shape[0]
        self.max_len = context_window(cfg)
        self.device = self.lm_head.weight.device
        self.dtype = self.lm_head.weight.dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.groups = self.n_heads // self.n_kv
        attn0 = self.layers[0].self_attn
        self.scale = getattr(attn0, "scaling", self.head_dim**-0.5)
        rotary = model.model.rotary_emb
        self._inv_freq = rotary.inv_freq.float().to(self.device)  # (head_dim/2,)
        self._rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self._cos = self._sin = torch.empty(0)
        self._k = self._v = torch.empty(0)  # (layers, n_kv, capacity, head_dim)
        self._length = 0

    def shallow(self, n_layers: int) -> "LlamaRunner":
        return LlamaRunner(self.model, n_layers)

    @property
    def length(self) -> int:
        return self._length

    def truncate(self, length: int) -> None:
        self._length = min(self._length, max(0, length))

    def _reserve(self, needed: int) -> None:
        if needed > self.max_len:
            raise ContextTooLongError(f"context of {needed} tokens exceeds the model's window of {self.max_len}")
        capacity = self._k.shape[2] if self._k.ndim == 4 else 0
        if needed <= capacity:
            return
        new_cap = min(self.max_len, max(needed, 2 * capacity, _GROW))
        shape = (len(self.layers), self.n_kv, new_cap, self.head_dim)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        if capacity:
            k[:, :, : self._length] = self._k[:, :, : self._length]
            v[:, :, : self._length] = self._v[:, :, : self._length]
        self._k, self._v = k, v
        # rotary tables for every position the cache can hold, computed in fp32 as transformers does
        pos = torch.arange(new_cap, device=self.device, dtype=torch.float32)
        freqs = torch.outer(pos, self._inv_freq)  # (cap, head_dim/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (cap, head_dim)
        self._cos = (emb.cos() * self._rope_scale).to(self.dtype)
        self._sin = (emb.sin() * self._rope_scale).to(self.dtype)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, last: int = 1) -> torch.Tensor:
        t = tokens.shape[0]
        start = self._length
        end = start + t
        self._reserve(end)
        x = self.embed(tokens.to(self.device))  # (T, D)
        cos = self._cos[start:end]  # (T, hd)
        sin = self._sin[start:end]
        mask = None
        if t > 1 and start > 0:  # query i (position start+i) sees keys 0 .. start+i
            keys = torch.arange(end, device=self.device)
            queries = torch.arange(start, end, device=self.device)
            mask = (keys[None, :] <= queries[:, None]).repeat(self.groups, 1)  # (groups*T, end)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer.self_attn, layer.input_layernorm(x), cos, sin, start, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        h = self.norm(x[-last:])  # (last, D)
        self._length = end
        return self.lm_head(h).float()  # (last, V)

    def _attention(self, i, attn, x, cos, sin, start, mask) -> torch.Tensor:
        t = x.shape[0]
        end = start + t
        q = attn.q_proj(x).view(t, self.n_heads, self.head_dim).transpose(0, 1)  # (H, T, hd)
        k = attn.k_proj(x).view(t, self.n_kv, self.head_dim).transpose(0, 1)  # (KV, T, hd)
        v = attn.v_proj(x).view(t, self.n_kv, self.head_dim).transpose(0, 1)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before rotary
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self._k[i, :, start:end] = k
        self._v[i, :, start:end] = v
        if start == 0 and t > 1:  # prefill: plain causal attention, the fused kernel applies
            out = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, scale=self.scale, enable_gqa=True)
            return attn.o_proj(out[0].transpose(0, 1).reshape(t, -1))
        keys = self._k[i, :, :end]  # (KV, L, hd)
        values = self._v[i, :, :end]
        # grouped-query attention without copying K/V: the query heads that share a KV head become
        # extra query rows of that head, (H, T, hd) -> (KV, groups*T, hd)
        q = q.reshape(self.n_kv, self.groups * t, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
        out = out.reshape(self.n_heads, t, self.head_dim).transpose(0, 1).reshape(t, -1)  # (T, H*hd)
        return attn.o_proj(out)
