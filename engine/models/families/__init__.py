"""A model family as one small file: what its layers compute, as values.

Each module here describes one family (`Family`): where its norms sit and of which kind, its q/k norms, how its
projections are stored, which layers attend over a window and which rotate, how its queries are scaled, and how
llama.cpp's files name and order what is not transformers' own. `spec_of(config)` reads a model's config through its
family into a `Spec`: the values the lean forward, the compiled step, the GPU step and the GGUF reader run on. A
family that is not here gets a `Spec` with no family, whose `gaps` say in a user's words what Specula's own forward
does not compute; so does a known family's model with something no family file can express (experts, a vision
tower, another activation). A new family is a new module, added to FAMILY_MODULES.
"""

from __future__ import annotations

import importlib
import weakref
from dataclasses import dataclass, field
from typing import Callable

# the modules that describe a family each (FAMILY in each), in the order a user reads them
FAMILY_MODULES = ("llama", "qwen2", "qwen3", "mistral", "ministral", "smollm3", "phi3", "granite", "olmo2", "gemma2", "gemma3",
                  "exaone4")

# where a layer's norms sit: before attention, before the MLP, on attention's output, on the MLP's output
NORM_SLOTS = ("attn_in", "mlp_in", "attn_out", "mlp_out")
LLAMA_NORMS = (("attn_in", "input_layernorm"), ("mlp_in", "post_attention_layernorm"))
OUTPUT_NORMS = (("attn_out", "post_attention_layernorm"), ("mlp_out", "post_feedforward_layernorm"))
GELU_TANH = frozenset({"gelu_pytorch_tanh", "gelu_new"})  # GELU by its tanh approximation
_GATES = frozenset({"silu", "swish"}) | GELU_TANH  # the gated MLPs the forwards compute
_ACTIVATIONS = {"gelu_pytorch_tanh": "GELU-tanh", "gelu_new": "GELU-tanh", "gelu": "GELU", "relu": "ReLU"}
# llama.cpp's GGUF keys of the Llama layer, for families transformers' GGUF table leaves out
LLAMA_KEYS = {
    "context_length": "max_position_embeddings", "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size", "embedding_length": "hidden_size", "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps", "vocab_size": "vocab_size"}


def _get(config, name: str, default=None):
    value = getattr(config, name, default)
    return default if value is None else value


def head_dim(config) -> int:
    return int(_get(config, "head_dim") or config.hidden_size // config.num_attention_heads)


def windows_by_layer_type(config) -> tuple[int, ...]:
    """The config's sliding window on the layers its `layer_types` call sliding, 0 (all positions) elsewhere."""
    n, window = int(config.num_hidden_layers), int(_get(config, "sliding_window", 0) or 0)
    kinds = _get(config, "layer_types", ()) or ()
    return tuple(window if i < len(kinds) and kinds[i] == "sliding_attention" else 0 for i in range(n))


def window_everywhere(config) -> tuple[int, ...]:
    """The config's sliding window on every layer (Mistral, Phi-3); 0: none."""
    return (int(_get(config, "sliding_window", 0) or 0),) * int(config.num_hidden_layers)


def rotary_everywhere(config) -> tuple[bool, ...]:
    return (True,) * int(config.num_hidden_layers)


def scale_by_head(config) -> float:
    """Attention scores scaled by 1/sqrt(the heads' width)."""
    return head_dim(config) ** -0.5


@dataclass(frozen=True)
class Family:
    """One family's layer, as values and a few functions of its config (defaults: the Llama layer's)."""

    name: str
    model_types: tuple[str, ...]  # transformers' names of its configs
    gguf_archs: tuple[str, ...] = ()  # llama.cpp's names of its files
    norms: tuple[tuple[str, str], ...] = LLAMA_NORMS  # (NORM_SLOTS entry, the layer's module) of each norm it has
    norm_offset: float = 0.0  # RMS norms scale by offset + w (Gemma's 1 + w)
    wide_norms: bool = False  # the scale multiplies the fp32 rows before they are rounded (Gemma's, OLMo 2's)
    qk_norms: str = ""  # "head": each query and key head normed before rotary; "whole": all query heads as one row
    # and all key heads as another (OLMo 2); "": none
    qkv: tuple[str, ...] = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # one module: stored fused
    gate_up: tuple[str, ...] = ("mlp.gate_proj", "mlp.up_proj")
    windows: Callable = windows_by_layer_type  # config -> each layer's sliding window (0: all positions)
    rotary: Callable = rotary_everywhere  # config -> whether each layer's queries and keys rotate
    scale: Callable = scale_by_head  # config -> what attention scores are multiplied by
    gguf_permuted_qk: bool = False  # llama.cpp's converter permutes q/k rows as it does Llama's
    gguf_offset_norms: bool = False  # llama.cpp's converter stores the norms as 1 + w
    gguf_keys: dict | None = None  # GGUF key -> config name, where transformers' table leaves the family out
    gguf_config: Callable | None = None  # (file, values) -> None: what else the file's metadata says, into values
    # (llama.cpp's architecture, a word): its files are of that architecture with the word in their `general.name`
    # (Mistral's, stored as Llama's)
    gguf_named: tuple[str, str] | None = None


@dataclass(frozen=True)
class LayerSpec:
    """What one layer does differently from the others: its window, whether it rotates, and which rotary table
    it reads where the model keeps one per kind of layer (Gemma 3's local and global bases; None: the one)."""

    window: int = 0
    rotary: bool = True
    rope_kind: str | None = None


@dataclass(frozen=True)
class Spec:
    """A model's description, read from its config through its family: what every forward runs on."""

    model_type: str
    family: Family | None
    layers: tuple[LayerSpec, ...] = ()
    activation: str = "silu"  # transformers' name of the MLP's gate activation
    attention_scale: float = 1.0
    embedding_multiplier: float = 1.0  # Granite's (Gemma's sqrt(hidden) is its embedding module's own)
    residual_multiplier: float = 1.0  # each attention and MLP output before it is added
    logit_divisor: float = 1.0  # Granite's logits scaling
    attention_softcap: float = 0.0  # scores capped at cap * tanh(score / cap) (Gemma 2); 0: none
    final_softcap: float = 0.0  # the logits capped so
    gaps: tuple[str, ...] = field(default=())
    # the shapes (0 where the config has no family): query and key/value heads, a head's width, the hidden and the
    # MLP's widths
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    hidden: int = 0
    intermediate: int = 0

    @property
    def runs(self) -> bool:
        """Whether Specula's own forward computes this model."""
        return self.family is not None and not self.gaps

    @property
    def gelu(self) -> bool:
        """The MLP's gate through GELU (tanh), not SiLU."""
        return self.activation in GELU_TANH

    @property
    def norm_offset(self) -> float:
        return self.family.norm_offset if self.family else 0.0

    @property
    def wide_norms(self) -> bool:
        return bool(self.family and (self.family.wide_norms or self.family.norm_offset))

    @property
    def norms(self) -> dict[str, str]:
        """NORM_SLOTS entry -> the layer's module, for the norms a layer has."""
        return dict(self.family.norms) if self.family else {}


def _families() -> dict[str, Family]:
    found = {}
    for name in FAMILY_MODULES:
        family = importlib.import_module(f"{__name__}.{name}").FAMILY
        found.update({model_type: family for model_type in family.model_types})
    return found


_BY_TYPE: dict[str, Family] = {}


def families() -> dict[str, Family]:
    """transformers' model_type -> its Family, for every family described here."""
    if not _BY_TYPE:
        _BY_TYPE.update(_families())
    return _BY_TYPE


def for_gguf(arch: str) -> Family | None:
    """The family of a GGUF file's architecture (llama.cpp's name), or None."""
    return next((f for f in families().values() if arch in f.gguf_archs), None)


# transformers' GGUF tensor processor that undoes llama.cpp's permutation of q/k rows (`gguf_permuted_qk`): Llama's
GGUF_QK_PROCESSOR = "llama"


def gguf_model_type(arch: str, name: str) -> str:
    """transformers' model type of a GGUF file of llama.cpp's architecture `arch` named `name` (`general.name`): a
    family's that claims such files, or the architecture's own name."""
    name = name.lower()
    for family in families().values():
        if family.gguf_named and family.gguf_named[0] == arch and family.gguf_named[1] in name:
            return family.model_types[0]
    family = for_gguf(arch)
    return family.model_types[0] if family is not None else arch


def projections() -> tuple[str, ...]:
    """Every family's projection modules of a layer (a layer's module names, fused ones included)."""
    found = {"self_attn.o_proj", "mlp.down_proj"}
    for family in families().values():
        found.update(family.qkv, family.gate_up)
    return tuple(sorted(found))


def _text(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _experts(config) -> int:
    return max(int(_get(config, name, 0) or 0)
               for name in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))


def _rope_types(config) -> set[str]:
    rope = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    tables = rope.values() if rope and all(isinstance(v, dict) for v in rope.values()) else [rope]
    return {str(t.get("rope_type", t.get("type", "default"))) for t in tables if isinstance(t, dict)}


def _unknown_gaps(config) -> tuple[str, ...]:
    """What a config of a family not described here asks that the lean forward would have to know (in a user's words)."""
    act = str(_get(config, "hidden_activation") or _get(config, "hidden_act") or "silu")
    rope = _get(config, "rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", _get(config, "partial_rotary_factor", 1.0)) if isinstance(rope, dict) else 1.0
    found = (
        (act not in _GATES, f"a {_ACTIVATIONS.get(act, act)} MLP"),
        (float(factor or 1.0) < 1.0 or float(_get(config, "rotary_pct", 1.0)) < 1.0, "rotary over part of each head"),
        (bool(_get(config, "final_logit_softcapping") or _get(config, "attn_logit_softcapping")), "soft-capped logits"),
    )
    return tuple(text for present, text in found if present) or ("a layer shape it does not know",)


def spec_of(config) -> Spec:
    """The spec a transformers config describes (a multimodal config: its text part, a vision tower a gap)."""
    text = _text(config)
    model_type = getattr(text, "model_type", "") or getattr(config, "model_type", "")
    family = families().get(model_type)
    act = str(_get(text, "hidden_activation") or _get(text, "hidden_act") or "silu")
    experts = _experts(text)
    gaps = [text_ for present, text_ in (
        (experts, f"a mixture of experts ({experts} a layer)"),
        (getattr(config, "vision_config", None) is not None, "a vision tower"),
    ) if present]
    if family is None:
        return Spec(model_type, None, activation=act, gaps=tuple(gaps) + (() if gaps else _unknown_gaps(text)))
    if act not in _GATES:
        gaps.append(f"a {_ACTIVATIONS.get(act, act)} MLP")
    if "dynamic" in _rope_types(text):
        gaps.append("dynamic rotary scaling")
    n = int(text.num_hidden_layers)
    kinds = _get(text, "layer_types", ()) or ()
    rope = _get(text, "rope_parameters") or {}
    per_kind = bool(kinds) and isinstance(rope, dict) and all(k in rope for k in set(kinds))  # a table per kind
    windows, rotary = family.windows(text), family.rotary(text)
    layers = tuple(LayerSpec(int(windows[i]), bool(rotary[i]), kinds[i] if per_kind else None) for i in range(n))
    number = lambda name, default: float(_get(text, name, default) or default)  # noqa: E731
    heads = int(text.num_attention_heads)
    return Spec(model_type, family, layers, act, float(family.scale(text)), number("embedding_multiplier", 1.0),
                number("residual_multiplier", 1.0), number("logits_scaling", 1.0),
                number("attn_logit_softcapping", 0.0), number("final_logit_softcapping", 0.0), tuple(gaps),
                heads=heads, kv_heads=int(_get(text, "num_key_value_heads", 0) or heads), head_dim=head_dim(text),
                hidden=int(text.hidden_size), intermediate=int(_get(text, "intermediate_size", 0) or 0))


# a loaded model's spec, computed once (beside the model rather than on it: a copy of the model is another model)
_SPECS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def spec_for(model) -> Spec:
    """The spec of a loaded model (`model.config`'s), computed at its first asking and kept while the model lives."""
    spec = _SPECS.get(model)
    if spec is None:
        spec = _SPECS[model] = spec_of(model.config)
    return spec


def sqrt_scale(name: str) -> Callable:
    """Attention scores scaled by 1/sqrt(the config's `name`) (Gemma's query_pre_attn_scalar)."""
    return lambda config: float(getattr(config, name)) ** -0.5  # as transformers computes it, to the bit
