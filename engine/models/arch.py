"""A model's architecture as data: what its decoder computes, read from its transformers config.

`describe(config)` gives an `Architecture`; `Architecture.gaps` names what of it Specula's own forward
(`llama.py`: RMS norms before attention and the MLP, and Gemma 3's four of its own kind; a SiLU- or GELU-tanh-gated
MLP; rotary over all or part of each head, or none, per layer, with its kind of layer's table; full or sliding-window
attention; optional q/k/v biases and per-head q/k norms; fused or separate projections) does not compute, in a
user's words. A model with no gaps runs the lean forward and the compiled step; one with gaps runs transformers'
forward, and the load's one line (`LoadedModel.path`) says which of them sent it there.
"""

from __future__ import annotations

from dataclasses import dataclass

# the families Specula's own forward runs (llama.LLAMA_FAMILY): the Llama layer, and Gemma 3's (text)
LEAN_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "ministral", "smollm3", "gemma3_text", "phi3", "granite",
                        "olmo2", "gemma2"})
GELU_TANH = frozenset({"gelu_pytorch_tanh", "gelu_new"})  # GELU by its tanh approximation
_GEMMA = frozenset({"gemma2", "gemma3_text"})
# the features of Architecture Specula's own forward computes, and for which families
_NATIVE_IN = {
    "norm_offset": _GEMMA, "sandwich_norms": LEAN_TYPES, "embedding_scale": _GEMMA | {"granite"},
    "soft_capping": frozenset({"gemma2"}), "sliding_layers": LEAN_TYPES, "partial_rotary": frozenset({"phi3"}),
    "multipliers": frozenset({"granite"}), "fused_weights": frozenset({"phi3"}), "head_norms": LEAN_TYPES,
}
_ACTIVATIONS = {"gelu_pytorch_tanh": "GELU-tanh", "gelu_new": "GELU-tanh", "gelu": "GELU", "relu": "ReLU"}


@dataclass(frozen=True)
class Architecture:
    """What a model's layers compute, as far as it decides which forward can run them."""

    model_type: str
    activation: str = "silu"  # the MLP's gate activation
    head_norms: bool = False  # per-head RMS norms of queries and keys before rotary (Qwen3, Gemma 3, OLMo 2)
    biases: bool = False  # q/k/v biases (Qwen2)
    norm_offset: float = 0.0  # RMS norms scale by offset + w (Gemma's 1 + w)
    sandwich_norms: bool = False  # norms after attention and after the MLP too (Gemma 2/3, OLMo 2)
    embedding_scale: bool = False  # embeddings multiplied by a factor (Gemma's sqrt(hidden), Granite's)
    soft_capping: bool = False  # attention or final logits soft-capped (Gemma 2)
    sliding_layers: int = 0  # layers attending over a sliding window only (Gemma 2/3, Mistral's window)
    layers_without_rotary: int = 0  # SmolLM3 (the lean forward skips rotary there)
    partial_rotary: bool = False  # rotary over part of each head (Phi, GPT-NeoX)
    multipliers: bool = False  # residual or logit multipliers (Granite)
    fused_weights: bool = False  # q/k/v and gate/up stored as one weight each (Phi-3)
    experts: int = 0  # a mixture of experts: experts per layer (0: a dense MLP)
    vision: bool = False  # a vision tower beside the text model

    @property
    def gaps(self) -> tuple[str, ...]:
        """What of this architecture Specula's own forward does not compute (empty: it runs it): a feature counts
        where the family is not among those `_NATIVE_IN` names for it (their modules tell the forward how)."""
        native = lambda feature: self.model_type in _NATIVE_IN[feature]  # noqa: E731
        found = (
            (self.experts, f"a mixture of experts ({self.experts} a layer)"),
            (self.vision, "a vision tower"),
            (self.activation not in ("silu", "swish", *GELU_TANH),
             f"a {_ACTIVATIONS.get(self.activation, self.activation)} MLP"),
            (self.norm_offset and not native("norm_offset"), f"norms scaled by {self.norm_offset:g} + w"),
            (self.sandwich_norms and not native("sandwich_norms"), "norms after attention and the MLP"),
            (self.embedding_scale and not native("embedding_scale"), "scaled embeddings"),
            (self.soft_capping and not native("soft_capping"), "soft-capped logits"),
            (self.sliding_layers and not native("sliding_layers"), "sliding-window layers"),
            (self.partial_rotary and not native("partial_rotary"), "rotary over part of each head"),
            (self.multipliers and not native("multipliers"), "residual and logit multipliers"),
            (self.fused_weights and not native("fused_weights"), "fused q/k/v and gate/up weights"),
            (self.head_norms and not native("head_norms"), "per-head q/k norms of this family"),
        )
        gaps = [text for present, text in found if present]
        if not gaps and self.model_type not in LEAN_TYPES:
            gaps.append("a layer shape it does not know")
        return tuple(gaps)


def final_norm(model) -> tuple:
    """The model's final RMS norm as (its scale in fp32, epsilon): the weight, plus Gemma's 1."""
    norm = model.model.norm
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    return norm.weight.detach().float() + describe(model.config).norm_offset, eps


def embedding_scale(module) -> float:
    """What the model multiplies its token embeddings by (Gemma's sqrt(hidden)); 1.0 for most."""
    return float(getattr(module, "scalar_embed_scale", 1.0))


def describe(config) -> Architecture:
    """The architecture a transformers config describes (a multimodal config: its text part, noting the tower)."""
    vision = getattr(config, "vision_config", None) is not None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = getattr(text, "model_type", "") or getattr(config, "model_type", "")
    get = lambda name, default=None: getattr(text, name, default)  # noqa: E731
    act = get("hidden_activation") or get("hidden_act") or "silu"
    experts = max(int(get(name) or 0) for name in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))
    gemma = model_type.startswith("gemma")
    layer_types = get("layer_types") or ()
    sliding = sum(1 for kind in layer_types if kind == "sliding_attention")
    window = get("sliding_window")
    if not sliding and window and (get("use_sliding_window") or model_type in ("mistral", "phi3")):
        sliding = int(get("num_hidden_layers") or 0)  # one window over every layer
    no_rope = get("no_rope_layers") or ()
    rope = get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", get("partial_rotary_factor", 1.0)) if isinstance(rope, dict) else 1.0
    partial = float(factor or 1.0) < 1.0 or float(get("rotary_pct", 1.0) or 1.0) < 1.0
    return Architecture(
        model_type=model_type,
        activation=str(act),
        head_norms=model_type in ("qwen3", "gemma3_text", "olmo2") or (gemma and model_type.startswith("gemma3")),
        biases=bool(get("attention_bias", False)) or model_type == "qwen2",
        norm_offset=1.0 if gemma else 0.0,
        sandwich_norms=model_type in ("gemma2", "gemma3_text", "gemma3", "olmo2"),
        embedding_scale=gemma or bool(get("embedding_multiplier")) and float(get("embedding_multiplier")) != 1.0,
        soft_capping=bool(get("final_logit_softcapping") or get("attn_logit_softcapping")),
        sliding_layers=sliding,
        layers_without_rotary=sum(1 for use in no_rope if not use) if no_rope else 0,
        partial_rotary=partial,
        multipliers=model_type.startswith("granite") or any(
            float(get(name) or 1.0) != 1.0 for name in ("residual_multiplier", "logits_scaling")),
        fused_weights=model_type == "phi3",
        experts=experts,
        vision=vision,
    )

