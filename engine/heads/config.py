"""What a draft head is and whom it is for: its dimensions (`HeadConfig`), its head.json (`HeadInfo`), and
the fingerprints that tie it to one target's weights and vocabulary."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field

import torch

from ..api.errors import SpeculaError
from ..models.gguf import out_features, weight_rows

FORMAT = 1


ROPE_KINDS = ("default", "linear", "llama3")


def rope_kind(scaling: dict | None) -> str:
    """A rope_scaling's type ("default" for none); raises ValueError for one draft heads cannot apply."""
    kind = str((scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default")
    if kind not in ROPE_KINDS:
        raise ValueError(f"rotary scaling '{kind}' is not supported for draft heads ({', '.join(ROPE_KINDS)} are)")
    needs = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}
    missing = [name for name in needs.get(kind, ()) if name not in scaling]
    if missing:
        raise ValueError(f"rotary scaling '{kind}' lacks {', '.join(missing)}")
    return kind


@dataclass(frozen=True)
class HeadConfig:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10000.0
    eps: float = 1e-5
    medusa_heads: int = 4  # medusa: how many tokens ahead the heads guess
    # EAGLE-3 (eagle3.py): the target layers whose entering hidden states the head reads, the size of its
    # draft vocabulary, and the target's hidden size where it differs from the head's (0: the same)
    aux_layers: tuple[int, ...] = ()
    draft_vocab: int = 0
    target_hidden: int = 0
    # a published head's rotary scaling as its config.json gives it (Llama 3.1's "llama3", "linear"); None: plain
    rope_scaling: dict | None = field(default=None, hash=False)

    def inverse_frequencies(self, device=None) -> torch.Tensor:
        """The rotary embedding's frequencies, (head_dim / 2,), with the head's scaling applied."""
        inv = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, device=device, dtype=torch.float32)
                                         / self.head_dim))
        scaling = self.rope_scaling or {}
        kind = rope_kind(scaling)
        if kind == "linear":
            return inv / float(scaling["factor"])
        if kind == "llama3":  # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a blend between
            factor, low, high = float(scaling["factor"]), float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
            original = float(scaling["original_max_position_embeddings"])
            wavelength = 2 * math.pi / inv
            blend = ((original / wavelength - low) / (high - low)).clamp(0.0, 1.0)
            scaled = (1 - blend) * inv / factor + blend * inv
            return torch.where(wavelength < original / high, inv, torch.where(wavelength > original / low, inv / factor, scaled))
        return inv


    @classmethod
    def for_target(cls, config) -> "HeadConfig":
        heads = config.num_attention_heads
        return cls(
            hidden=config.hidden_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size,
            rope_theta=float(getattr(config, "rope_theta", None) or 10000.0),
            eps=float(getattr(config, "rms_norm_eps", 1e-5)),
        )


@dataclass
class HeadInfo:
    """What head.json says: enough to refuse a head made for another model."""

    kind: str
    config: HeadConfig
    target: str  # fingerprint of the target's configuration and weights
    vocabulary: str  # fingerprint of the tokenizer's vocabulary
    target_name: str = ""
    training: dict = field(default_factory=dict)
    format: int = FORMAT

    def to_json(self) -> str:
        data = asdict(self)
        return json.dumps(data, indent=2)

    @classmethod
    def from_json(cls, text: str) -> "HeadInfo":
        data = json.loads(text)
        config = dict(data["config"])
        config["aux_layers"] = tuple(config.get("aux_layers", ()))
        data["config"] = HeadConfig(**config)
        return cls(**data)


def target_fingerprint(model) -> str:
    """The architecture and a sample of the weights: two models with the same shapes still differ."""
    cfg = model.config
    digest = hashlib.sha256()
    shape = (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size)
    digest.update(repr(shape).encode())
    with torch.no_grad():
        parts = (weight_rows(model.get_input_embeddings(), slice(None, 16))[:, :64],
                 weight_rows(model.get_output_embeddings(), slice(-16, None))[:, :64])
        # through bf16, then rounded: the same weights loaded in fp32, fp16 or bf16 give the same values
        sample = torch.cat([p.detach().to(torch.bfloat16).float().cpu().flatten() for p in parts])
    digest.update(sample.numpy().round(3).tobytes())
    return digest.hexdigest()[:16]


def vocabulary_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def check_draft_ids(ids: torch.Tensor, target, weights) -> None:
    """A one-line error where a head's draft vocabulary (the target's token id of each of its rows) names an id the
    target's vocabulary has not: drafting it would read past the model's embedding."""
    if not ids.numel():
        return
    vocab = out_features(target.model.get_output_embeddings())
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
        raise SpeculaError(f"the draft head {weights} drafts token id {high if high >= vocab else low}, which "
                           f"{target.name}'s vocabulary of {vocab} tokens has not: the head is damaged or was made for "
                           "another model")


def misfit(module, state: dict, strict: bool = True) -> str | None:
    """What keeps `state` from loading into `module`, naming the tensor and both shapes (torch's own message is
    cut after its first line, "Error(s) in loading state_dict for Eagle3Head:"); None where it fits. Without
    `strict`, tensors only the file has, or only the module has, are allowed."""
    wanted = module.state_dict()
    for name, tensor in state.items():
        if name in wanted and tuple(tensor.shape) != tuple(wanted[name].shape):
            return (f"{name} is {tuple(tensor.shape)} in the file but {tuple(wanted[name].shape)} for this head "
                    "(a head of another size or for another model)")
    if strict:
        missing = sorted(set(wanted) - set(state))
        if missing:
            return f"it lacks {', '.join(missing[:3])}{'...' if len(missing) > 3 else ''}"
        extra = sorted(set(state) - set(wanted))
        if extra:
            return f"it holds {', '.join(extra[:3])}{'...' if len(extra) > 3 else ''}, which this kind of head has not"
    return None
