"""Draft heads as their projects publish them, read from a folder with the project's config.json:

- EAGLE-1/EAGLE-2 checkpoints (SafeAILab/EAGLE's layout, the one vLLM and SGLang load): `fc` over
  [token embedding, target hidden state], one Llama layer without an input norm, no final norm; the
  target's hidden states are read after its final norm and the head's outputs go to the target's LM head
  as they are. `pytorch_model.bin` or `model.safetensors`; an `embed_tokens.weight` in the file is used.
- EAGLE-3 checkpoints (SafeAILab's and SpecForge's layout, as vLLM and SGLang load them): `fc` over the
  hidden states entering three target layers (by default 2, L/2 and L-3 of L; a config's
  `eagle_aux_hidden_state_layer_ids` name layers by output, SpecForge's and SGLang's reading), one layer
  whose attention reads [input_layernorm(embedding), hidden_norm(h)], its own final norm and LM head over a
  reduced vocabulary whose token i is target token i + d2t[i]. A draft step feeds its output (before the
  norm) back in place of the three layers' states. The speculators library's EAGLE-3 heads (the layout
  vLLM's own trained heads are published in: `speculators_model_type` "eagle3", the layer's dimensions in
  `transformer_layer_config`, `layers.0.*`, its layer ids naming the layers whose entering states it reads)
  load too, with the variants its flags name (`norm_before_fc`, `fc_norm`, `norm_before_residual`,
  `norm_output`; `eagle3.Variant`).
- Medusa heads: FasterDecoding's `medusa_lm_head.pt` (or `.safetensors`) with keys `{head}.{layer}.linear.*`
  and each head's own LM head `{head}.{layers}.weight` (or none: the target's), and vLLM's MedusaModel
  layout (`blocks.{head}.layers.{layer}.*`, `lm_heads.{head}.weight`, an optional `token_map`). Each layer
  is x + SiLU(W x + b) over the target's hidden state after its final norm.

A checkpoint may be one file or several named by an index (`model.safetensors.index.json`,
`pytorch_model.bin.index.json`). `.bin` and `.pt` files are read with torch's weights-only loader, so a file
that would run code is refused.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..api.errors import SpeculaError, first_line, unsafe_pickle
from .config import HeadConfig, HeadInfo, check_draft_ids, misfit, rope_kind
from .eagle import EagleHead
from .eagle3 import Eagle3Head, Variant, default_aux_layers

# a checkpoint in one file, or split into several that an index names (`weight_map`: tensor -> file)
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
EAGLE_FILES = ("model.safetensors", "pytorch_model.bin", *INDEXES)
MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors", INDEXES[0])


class OtherModel(SpeculaError):
    """A published head made for another model (its sizes or layers do not fit the loaded one)."""


def _config(folder: Path) -> dict | None:
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpeculaError(f"the draft head's {path} is unreadable: {first_line(exc)}") from None
    except RecursionError:  # Python's reader stops at about a thousand levels
        raise SpeculaError(f"the draft head's {path} is unreadable: it nests lists or objects too deeply") from None
    if not isinstance(data, dict):
        raise SpeculaError(f"the draft head's {path} is not a JSON object")
    return data


def _shards(index: Path) -> dict[str, Path]:
    """A split checkpoint's index: each tensor's file (in the index's folder, never outside it)."""
    from ..remote.hub import weight_map

    try:
        names = weight_map(index)
    except ValueError as exc:
        raise SpeculaError(f"the draft head's {index} {exc}") from None
    files = {}
    for key, name in names.items():
        path = index.parent / name
        if Path(name).name != name or not path.is_file():
            raise SpeculaError(f"the draft head's {index} names {name}, which is not a file beside it")
        files[key] = path
    return files


# an EAGLE-3 head's vocabulary maps and a Medusa head's token map: small, and their values are checked
VALUE_KEYS = ("d2t", "t2d", "token_map")


def _read_weights(path: Path, shapes_only: bool = False) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors by name; `shapes_only`: the weights as meta tensors (names, shapes and dtypes, no
    values) read from a safetensors file's header or a memory-mapped torch file, so that a head is checked
    against the model without reading its weights (the maps of VALUE_KEYS with their values)."""
    if path.name in INDEXES:  # every file the index names, each read as one file is
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(_shards(path).values())):
            state.update(_read_weights(shard, shapes_only))
        return state
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            from safetensors.torch import load_file

            if shapes_only:
                with safe_open(str(path), framework="pt") as f:
                    state = {k: f.get_tensor(k) if k in VALUE_KEYS else _meta(f.get_slice(k)) for k in f.keys()}
            else:
                state = load_file(str(path))
        elif shapes_only:
            try:  # a zip file (torch's format since 1.6): mapped, not read
                state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # the legacy format cannot be mapped
                state = torch.load(str(path), map_location="cpu", weights_only=True)
            if isinstance(state, dict):
                state = {k: v.to("meta") if isinstance(v, torch.Tensor) and k not in VALUE_KEYS else v
                         for k, v in state.items()}
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated file, a pickle that would run code, not a checkpoint at all
        raise SpeculaError(f"the draft head {path} is unreadable: {unsafe_pickle(exc)[:200]}") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise SpeculaError(f"the draft head {path} holds no tensors by name")
    return state


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
                       "BOOL": torch.bool}


def _meta(part) -> torch.Tensor:
    """A safetensors slice's shape and dtype as a meta tensor."""
    dtype = _SAFETENSORS_DTYPES.get(part.get_dtype())
    if dtype is None:
        raise ValueError(f"tensors of type {part.get_dtype()}")
    return torch.empty(part.get_shape(), dtype=dtype, device="meta")


def _weight_keys(path: Path) -> set[str]:
    if path.name in INDEXES:
        return set(_shards(path))
    return set(_read_weights(path, shapes_only=True))


def _first(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / n for n in names if (folder / n).is_file()), None)


def published_kind(folder: Path) -> str | None:
    """'eagle', 'eagle3' or 'medusa' for a folder holding a published head, None for anything else."""
    folder = Path(folder)
    config = _config(folder)
    if config is None:
        return None
    if any(k.startswith("medusa") for k in config) or config.get("model_type") == "medusa" \
            or "MedusaModel" in (config.get("architectures") or []):
        return "medusa" if _first(folder, MEDUSA_FILES) else None
    if (folder / "medusa_lm_head.pt").is_file() or (folder / "medusa_lm_head.safetensors").is_file():
        return "medusa"
    weights = _first(folder, EAGLE_FILES)
    if weights is None:
        return None
    if "draft_vocab_size" in config or any("Eagle3" in a for a in config.get("architectures") or []):
        return "eagle3"
    keys = _weight_keys(weights)
    if "d2t" in keys or any(k.startswith("midlayer.") for k in keys):
        return "eagle3"
    if "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys:
        return "eagle"
    return None


def made_for_model(config: dict) -> str:
    """The model a published head names as its target ("" where it names none)."""
    spec = config.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    named = config.get("base_model_name_or_path") or (verifier.get("name_or_path") if isinstance(verifier, dict) else None)
    return str(named or "")


def _check_target(folder: Path, target, hidden: int, vocab: int | None, config: dict) -> None:
    model_cfg = target.model.config
    t_hidden = model_cfg.hidden_size
    t_vocab = target.model.get_output_embeddings().weight.shape[0]
    if hidden != t_hidden or (vocab is not None and vocab != t_vocab):
        made_for = made_for_model(config) or f"a model of hidden size {hidden}" + (
            f" and {vocab} tokens" if vocab is not None else "")
        raise OtherModel(f"the draft head in {folder} was made for {made_for}, not {target.name} "
                           f"(hidden size {t_hidden}, {t_vocab} tokens)")


def _head_config(folder: Path, config: dict, hidden: int, head_dim: int | None = None) -> HeadConfig:
    """An EAGLE head's dimensions from its config.json (head_dim: hidden / heads unless given)."""
    heads = int(config.get("num_attention_heads", 0)) or None
    if heads is None or "intermediate_size" not in config:
        raise SpeculaError(f"the draft head's config.json in {folder} lacks num_attention_heads or intermediate_size")
    # rotary settings as older configs give them (rope_theta, rope_scaling) or newer ones (rope_parameters)
    rope = dict(config.get("rope_parameters") or {})
    scaling = {k: v for k, v in (config.get("rope_scaling") or rope).items() if k != "rope_theta"} or None
    try:
        plain = rope_kind(scaling) == "default"
    except ValueError as exc:
        raise SpeculaError(f"the draft head in {folder} cannot be used: {exc}") from None
    return HeadConfig(hidden=hidden, heads=heads, kv_heads=int(config.get("num_key_value_heads") or heads),
                      head_dim=head_dim or hidden // heads, intermediate=int(config["intermediate_size"]),
                      rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0),
                      eps=float(config.get("rms_norm_eps", 1e-6)), rope_scaling=None if plain else scaling)


def _load_named(head: nn.Module, state: dict, names: dict[str, str], weights: Path, what: str) -> None:
    """The file's tensors into `head` by `names` (the file's -> the module's); every tensor the head has
    must be there, in the shape its config gives."""
    mapped = {names[k]: v for k, v in state.items() if k in names}
    missing = [k for k in head.state_dict() if k not in mapped and k != "draft_ids"]
    if missing:
        raise SpeculaError(f"the {what} head {weights} lacks {', '.join(sorted(missing)[:3])}")
    wrong = misfit(head, mapped, strict=False)
    if wrong is not None:  # shapes that do not fit the config
        raise SpeculaError(f"the {what} head {weights} does not fit its config.json: {wrong}")
    head.load_state_dict(mapped, strict=False)


class PublishedEagle(EagleHead):
    """An EAGLE-1/EAGLE-2 head in SafeAILab's layout: fc over [embedding, feature] (with a bias unless the
    config says "bias": false), one Llama layer without an input norm (q/k/v biases where the file has
    them: Qwen2), no final norm."""

    reads_normed = True

    def __init__(self, config: HeadConfig, fc_bias: bool, qkv_bias: bool, vocab: int | None) -> None:
        super().__init__(config)
        c = config
        del self.feature_norm, self.embed_norm
        self.fc = nn.Linear(2 * c.hidden, c.hidden, bias=fc_bias)
        self.attn_norm = nn.Identity()
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=qkv_bias)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=qkv_bias)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=qkv_bias)
        self.embed = nn.Embedding(vocab, c.hidden) if vocab is not None else None  # the file's copy

    def combine(self, features: torch.Tensor, next_embeds: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat((next_embeds, features), dim=-1))


EAGLE_KEYS = {  # the file's names -> the module's
    "fc.weight": "fc.weight", "fc.bias": "fc.bias", "embed_tokens.weight": "embed.weight",
    "layers.0.post_attention_layernorm.weight": "mlp_norm.weight",
    **{f"layers.0.self_attn.{n}_proj.{p}": f"{n}.{p}" for n in "qkvo" for p in ("weight", "bias")},
    **{f"layers.0.mlp.{n}_proj.weight": f"{n}.weight" for n in ("gate", "up", "down")},
}


def load_eagle(folder: Path, target, config: dict, shapes_only: bool = False) -> tuple[PublishedEagle, HeadInfo]:
    weights = _first(folder, EAGLE_FILES)
    state = _read_weights(weights, shapes_only)
    if "fc.weight" not in state or "layers.0.self_attn.q_proj.weight" not in state:
        raise SpeculaError(f"{weights} is not an EAGLE head: no fc.weight or layers.0.self_attn.q_proj.weight")
    hidden = state["fc.weight"].shape[0]
    cfg = _head_config(folder, config, hidden)
    embed = state.get("embed_tokens.weight")
    vocab = int(embed.shape[0]) if embed is not None else None
    _check_target(folder, target, hidden, vocab if vocab is not None else config.get("vocab_size"), config)
    head = PublishedEagle(cfg, fc_bias="fc.bias" in state, qkv_bias="layers.0.self_attn.q_proj.bias" in state, vocab=vocab)
    _load_named(head, state, EAGLE_KEYS, weights, "EAGLE")
    return head, _info("eagle", cfg, folder, config)


EAGLE3_KEYS = {
    "fc.weight": "fc.weight", "norm.weight": "final_norm.weight", "lm_head.weight": "lm.weight",
    "embed_tokens.weight": "embed.weight", "midlayer.hidden_norm.weight": "hidden_norm.weight",
    "midlayer.input_layernorm.weight": "input_norm.weight", "midlayer.post_attention_layernorm.weight": "mlp_norm.weight",
    **{f"midlayer.self_attn.{n}_proj.weight": f"{n}.weight" for n in "qkvo"},
    **{f"midlayer.mlp.{n}_proj.weight": f"{n}.weight" for n in ("gate", "up", "down")},
}


def _eagle_config(config: dict) -> dict:
    return config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}


def speculators_layout(config: dict) -> bool:
    """Whether a config is the speculators library's (its draft layer's own config nested in it)."""
    return config.get("speculators_model_type") == "eagle3" or isinstance(config.get("transformer_layer_config"), dict)


def aux_layers_of(config: dict, target_layers: int) -> tuple[int, ...]:
    """The target layers whose entering hidden states an EAGLE-3 head reads."""
    ids = _eagle_config(config).get("eagle_aux_hidden_state_layer_ids") or config.get("eagle_aux_hidden_state_layer_ids")
    if ids and speculators_layout(config):  # the speculators library (and vLLM's capture): the states entering them
        layers = tuple(sorted(int(i) for i in ids))
    elif ids:  # by output, as SpecForge writes them and SGLang reads them: entering the next layer
        layers = tuple(sorted(int(i) + 1 for i in ids))
    else:
        layers = default_aux_layers(target_layers)
    if len(set(layers)) != len(layers) or any(not 0 <= i < target_layers for i in layers):
        raise OtherModel(f"an EAGLE-3 head reading layers {list(layers)} does not fit a model of {target_layers} layers")
    return layers


def _variant(config: dict, state: dict, weights: Path) -> tuple[Variant, dict[str, str]]:
    """A published EAGLE-3 head's departures from EAGLE-3's formula, as its config's flags name them (top level
    or `eagle_config`, as vLLM reads them), and the names of their norms' tensors (the file's -> the module's)."""
    def flag(name: str) -> bool:
        value = _eagle_config(config).get(name, config.get(name, False))
        return bool(value)

    before_fc, each = flag("norm_before_fc"), flag("fc_norm")
    if before_fc and each:
        raise SpeculaError(f"the EAGLE-3 head {weights} asks for both norm_before_fc and fc_norm, which exclude each other")
    names = {}
    if before_fc:
        names["input_norm.weight"] = "aux_norm.weight"
    if each:
        names.update({k: k.replace("fc_norm.", "aux_norms.", 1) for k in state if k.startswith("fc_norm.")})
    unnamed = [k for k in state if k.startswith(("fc_norm", "input_norm")) and k not in names]
    if unnamed:
        raise SpeculaError(f"the EAGLE-3 head {weights} has {unnamed[0]}, which its config.json does not say how to use "
                           "(norm_before_fc or fc_norm)")
    qk = all(f"midlayer.self_attn.{n}_norm.weight" in state for n in "qk")  # a Qwen3 layer
    if qk:
        names.update({f"midlayer.self_attn.{n}_norm.weight": f"{n}_norm.weight" for n in "qk"})
    return Variant("whole" if before_fc else "each" if each else None, flag("norm_before_residual"),
                   flag("norm_output"), qk), names


def load_eagle3(folder: Path, target, config: dict, shapes_only: bool = False) -> tuple[Eagle3Head, HeadInfo]:
    weights = _first(folder, EAGLE_FILES)
    raw = _read_weights(weights, shapes_only)
    file_name = {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: k for k in raw}
    state = {name: raw[k] for name, k in file_name.items()}
    if "fc.weight" not in state or "lm_head.weight" not in state:
        raise SpeculaError(f"{weights} is not an EAGLE-3 head: no fc.weight or lm_head.weight")
    # the speculators library nests the draft layer's own config (its dimensions, the target's vocabulary)
    layer_config = {**config, **config["transformer_layer_config"]} if speculators_layout(config) else config
    if int(layer_config.get("num_hidden_layers") or 1) > 1 or any(k.startswith("layers.1.") for k in state):
        raise SpeculaError(f"the EAGLE-3 head in {folder} has {layer_config.get('num_hidden_layers')} decoder layers; "
                           "this version runs EAGLE-3 heads of one")
    variant, norm_names = _variant(config, state, weights)
    hidden, wide = state["fc.weight"].shape
    cfg = _head_config(folder, layer_config, hidden, int(layer_config.get("head_dim") or 0) or None)
    target_layers = target.model.config.num_hidden_layers
    layers = aux_layers_of(config, target_layers)
    target_hidden = wide // len(layers)
    embed = state.get("embed_tokens.weight")
    vocab = layer_config.get("vocab_size")
    _check_target(folder, target, target_hidden, int(vocab) if vocab else None, config)
    if embed is None and hidden != target.model.config.hidden_size:
        raise SpeculaError(f"the EAGLE-3 head in {folder} is {hidden} wide and brings no embeddings for {target.name}'s")
    draft_vocab = state["lm_head.weight"].shape[0]
    cfg = replace(cfg, aux_layers=layers, draft_vocab=draft_vocab, target_hidden=target_hidden)
    head = Eagle3Head(cfg, int(embed.shape[0]) if embed is not None else None, variant)
    names = {**EAGLE3_KEYS, **norm_names}
    # a tensor the formula has no place for (a bias, another norm) would draft by another formula without a word
    unknown = [k for k in state if k not in names and k not in ("d2t", "t2d") and not k.endswith("rotary_emb.inv_freq")]
    if unknown:
        raise SpeculaError(f"the EAGLE-3 head {weights} has {file_name[unknown[0]]}, which this version does not run")
    _load_named(head, state, names, weights, "EAGLE-3")
    t_vocab = target.model.get_output_embeddings().weight.shape[0]
    if "d2t" in state:
        ids = torch.arange(draft_vocab, device=state["d2t"].device) + state["d2t"].long()
        if ids.shape != (draft_vocab,) or int(ids.min()) < 0 or int(ids.max()) >= t_vocab:
            raise SpeculaError(f"the EAGLE-3 head {weights} maps its vocabulary past {target.name}'s {t_vocab} tokens")
        head.draft_ids = ids
    elif draft_vocab != t_vocab:
        raise SpeculaError(f"the EAGLE-3 head {weights} drafts {draft_vocab} tokens without a d2t map to {t_vocab}")
    return head, _info("eagle", cfg, folder, config)


class PublishedMedusa(nn.Module):
    """Medusa heads as published: head i is `layers` residual blocks x + SiLU(W x + b) over the target's
    hidden state after its final norm, then its own LM head (or the target's), guessing the token i + 2
    places after the one whose feature it reads. A `MultiTokenHead` (protocol.py)."""

    reads_normed = True
    aux_layers: tuple[int, ...] = ()

    def __init__(self, hidden: int, heads: int, layers: int, bias: bool, vocab: int | None) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleList(nn.Linear(hidden, hidden, bias=bias) for _ in range(layers)) for _ in range(heads))
        self.lm_heads = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(heads)) if vocab else None
        self.register_buffer("draft_ids", torch.empty(0, dtype=torch.long))

    def head_logits(self, x: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """x (1, D), the target's normed feature -> each head's logits (heads, V'), fp32."""
        out = []
        for i, block in enumerate(self.blocks):
            y = x
            for layer in block:
                y = y + F.silu(layer(y))
            proj = self.lm_heads[i] if self.lm_heads is not None else lm_head
            out.append(proj(y.to(proj.weight.dtype))[0])
        return torch.stack(out).float()


def load_medusa(folder: Path, target, config: dict, shapes_only: bool = False) -> tuple[PublishedMedusa, HeadInfo]:
    weights = _first(folder, MEDUSA_FILES)
    state = _read_weights(weights, shapes_only)
    state = {k.removeprefix("medusa_heads."): v for k, v in state.items()}
    blocks: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    lm: dict[int, torch.Tensor] = {}
    token_map = state.pop("token_map", None)
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "blocks" and len(parts) == 5 and parts[2] == "layers":  # vLLM's layout
            blocks.setdefault((int(parts[1]), int(parts[3])), {})[parts[4]] = value
        elif parts[0] == "lm_heads" and len(parts) == 3:
            lm[int(parts[1])] = value
        elif parts[0].isdigit() and len(parts) == 4 and parts[2] == "linear":  # FasterDecoding's: h.l.linear.*
            blocks.setdefault((int(parts[0]), int(parts[1])), {})[parts[3]] = value
        elif parts[0].isdigit() and len(parts) == 3 and parts[2] == "weight":  # h.L.weight: head h's LM head
            lm[int(parts[0])] = value
        else:
            raise SpeculaError(f"{weights} is not a Medusa head: unexpected tensor {key}")
    if not blocks:
        raise SpeculaError(f"{weights} holds no Medusa blocks")
    heads = 1 + max(h for h, _ in blocks)
    layers = 1 + max(layer for _, layer in blocks)
    if any((h, layer) not in blocks for h in range(heads) for layer in range(layers)) or (lm and sorted(lm) != list(range(heads))):
        raise SpeculaError(f"{weights} does not hold every head's blocks (heads 0-{heads - 1}, layers 0-{layers - 1})")
    hidden = blocks[(0, 0)]["weight"].shape[0]
    vocab = lm[0].shape[0] if lm else None
    full_vocab = vocab if token_map is None else None
    _check_target(folder, target, hidden, full_vocab, config)
    bias = "bias" in blocks[(0, 0)]
    head = PublishedMedusa(hidden, heads, layers, bias, vocab)
    with torch.no_grad():
        try:
            for (h, layer), tensors in blocks.items():
                head.blocks[h][layer].weight.copy_(tensors["weight"])
                if bias:
                    head.blocks[h][layer].bias.copy_(tensors["bias"])
            for h, w in lm.items():
                head.lm_heads[h].weight.copy_(w)
        except (RuntimeError, KeyError) as exc:
            raise SpeculaError(f"the Medusa head {weights} has tensors of mixed shapes: {first_line(exc)[:200]}") from None
    if token_map is not None:
        head.draft_ids = token_map.long()
        check_draft_ids(head.draft_ids, target, weights)
    cfg = HeadConfig.for_target(target.model.config)
    return head, _info("medusa", HeadConfig(**{**cfg.__dict__, "medusa_heads": heads}), folder, config)


def head_folder(source: str, say=lambda text: None) -> Path:
    """A head's folder from what a user names: a folder here, or a Hub id whose head files are downloaded
    (into the Hugging Face cache; a second time they are found there)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise SpeculaError(f"a draft head is a folder, and {source} is a file")
    if source.count("/") != 1 or source.startswith((".", "/", "~")):
        raise SpeculaError(f"draft head not found: {source} is neither a folder nor a Hub id (owner/name)")
    from ..remote.hub import download_head

    say(f"downloading the draft head {source}")
    return Path(download_head(source))


def _info(kind: str, cfg: HeadConfig, folder: Path, config: dict) -> HeadInfo:
    return HeadInfo(kind=kind, config=cfg, target="", vocabulary="",
                    target_name=made_for_model(config), training={"published": str(folder)})


LOADERS = {"eagle": load_eagle, "eagle3": load_eagle3, "medusa": load_medusa}  # by `published_kind`


def named_hidden_size(config: dict) -> int | None:
    """The target hidden size a published head's config names (None where it names none: Medusa's)."""
    if speculators_layout(config):
        layer = config["transformer_layer_config"]
        return int(config.get("target_hidden_size") or layer.get("hidden_size") or 0) or None
    if config.get("medusa_num_heads") is not None or config.get("model_type") == "medusa":
        return None
    return int(config.get("hidden_size") or 0) or None  # SafeAILab's EAGLE heads: the target's own config


def fits(folder: Path, target, kind: str) -> str | None:
    """Why the published head of `kind` (`published_kind`'s) in `folder` is not one for this loaded target (None
    when it is): ANOTHER_MODEL for a head made for a model of other sizes or layers (told from its config alone
    where it names another hidden size; else from its tensors' names and shapes: the loader runs over meta
    tensors, reading no weights), else the loader's reason."""
    folder = Path(folder)
    config = _config(folder) or {}
    named = named_hidden_size(config)
    if named is not None and named != target.model.config.hidden_size:
        return ANOTHER_MODEL
    try:
        with torch.device("meta"):  # the head's module too: no memory, no initialisation
            LOADERS[kind](folder, target, config, shapes_only=True)
    except OtherModel:
        return ANOTHER_MODEL
    except SpeculaError as exc:
        return str(exc)
    return None


ANOTHER_MODEL = "made for a model of another size"


def load_published(folder: Path, target, dtype=None, kind: str | None = None) -> tuple[nn.Module, HeadInfo]:
    """The published head in `folder` for this loaded target, in the target's dtype on its device."""
    folder = Path(folder)
    found = published_kind(folder)
    if found is None:
        raise SpeculaError(f"no draft head in {folder}: neither Specula's head.json nor a published EAGLE or "
                           "Medusa head (config.json with its weights)")
    if kind is not None and found.rstrip("3") != kind:
        raise SpeculaError(f"{folder} holds a published {found} head, not the {kind} head this strategy needs")
    config = _config(folder)
    head, info = LOADERS[found](folder, target, config)
    head = head.to(device=target.device, dtype=dtype or target.dtype).eval()
    head.requires_grad_(False)
    return head, info
