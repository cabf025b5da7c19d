"""An EAGLE-style draft head (Li et al. 2024): one decoder layer that reads the target's final hidden
state at position t and the embedding of token t+1, and predicts the hidden state at t+1; the target's
own final norm and LM head turn that prediction into a token. It drafts by feeding its predictions back
in, with a small KV cache of its own.

Stored as DIR/head.safetensors (weights) and DIR/head.json (kind, dimensions, the target it was
trained for, training figures). A head only loads for the model it was trained on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import SpeculaError, first_line

FORMAT = 1


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
        data["config"] = HeadConfig(**data["config"])
        return cls(**data)


def target_fingerprint(model) -> str:
    """The architecture and a sample of the weights: two models with the same shapes still differ."""
    cfg = model.config
    digest = hashlib.sha256()
    shape = (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size)
    digest.update(repr(shape).encode())
    with torch.no_grad():
        parts = (model.get_input_embeddings().weight[:16, :64], model.get_output_embeddings().weight[-16:, :64])
        # through bf16, then rounded: the same weights loaded in fp32, fp16 or bf16 give the same values
        sample = torch.cat([p.detach().to(torch.bfloat16).float().cpu().flatten() for p in parts])
    digest.update(sample.numpy().round(3).tobytes())
    return digest.hexdigest()[:16]


def vocabulary_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def _rope(positions: torch.Tensor, head_dim: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(positions.float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class EagleHead(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        c = self.config = config
        self.feature_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.embed_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.fc = nn.Linear(2 * c.hidden, c.hidden, bias=False)
        self.attn_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.q = nn.Linear(c.hidden, c.heads * c.head_dim, bias=False)
        self.k = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.v = nn.Linear(c.hidden, c.kv_heads * c.head_dim, bias=False)
        self.o = nn.Linear(c.heads * c.head_dim, c.hidden, bias=False)
        self.mlp_norm = nn.RMSNorm(c.hidden, eps=c.eps)
        self.gate = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, c.hidden, bias=False)
        self._k = self._v = torch.empty(0)  # (kv_heads, capacity, head_dim): the drafting cache
        self._length = 0
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None
        # the token ids the head may draft (the most frequent in its training answers); empty: all
        self.register_buffer("draft_ids", torch.empty(0, dtype=torch.long))

    def forward(self, features: torch.Tensor, next_embeds: torch.Tensor, start: int = 0,
                use_cache: bool = False) -> torch.Tensor:
        """features (B, T, D) at positions start.., embeddings of the tokens that followed them (B, T, D)
        -> predicted features of the following positions (B, T, D). With use_cache (B = 1), keys and
        values go to the drafting cache at positions start.. and attention sees the cache before them."""
        c = self.config
        b, t, _ = features.shape
        h = self.fc(torch.cat((self.feature_norm(features), self.embed_norm(next_embeds)), dim=-1))
        x = self.attn_norm(h)
        q = self.q(x).view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._rope(torch.arange(start, start + t, device=h.device), h.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if use_cache:
            self._store(k[0], v[0], start)
            keys, values = self._k[:, : start + t][None], self._v[:, : start + t][None]
            mask = None
            if t > 1:
                mask = torch.arange(start + t, device=h.device)[None, :] <= torch.arange(start, start + t, device=h.device)[:, None]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + self.o(out.transpose(1, 2).reshape(b, t, -1))
        x = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))

    def forward_tree(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor, slot: int,
                     visible: torch.Tensor) -> torch.Tensor:
        """Tree drafting: rows (n, D) at rotary `positions` (n,) go to cache slots slot..slot+n-1; row i
        attends to the cache slots where visible[i] (n, slot+n) is True (the real context, its ancestors,
        itself) -> predicted features (n, D)."""
        c = self.config
        n = features.shape[0]
        h = self.fc(torch.cat((self.feature_norm(features), self.embed_norm(next_embeds)), dim=-1))
        x = self.attn_norm(h)
        q = self.q(x).view(n, c.heads, c.head_dim).transpose(0, 1)
        k = self.k(x).view(n, c.kv_heads, c.head_dim).transpose(0, 1)
        v = self.v(x).view(n, c.kv_heads, c.head_dim).transpose(0, 1)
        cos, sin = self._rope(positions, h.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        self._store(k, v, slot)
        keys, values = self._k[:, : slot + n][None], self._v[:, : slot + n][None]
        out = F.scaled_dot_product_attention(q[None], keys, values, attn_mask=visible, enable_gqa=True)[0]
        h = h + self.o(out.transpose(0, 1).reshape(n, -1))
        x = self.mlp_norm(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))

    def _rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables at these positions, from a table kept between calls (drafting calls this per token)."""
        need = int(positions.max()) + 1
        table = self._rope_table
        if table is None or table[0].shape[0] < need or table[0].dtype != dtype or table[0].device != positions.device:
            size = max(need, 2 * (table[0].shape[0] if table is not None else 0), 512)
            table = _rope(torch.arange(size, device=positions.device), self.config.head_dim, self.config.rope_theta, dtype)
            self._rope_table = table
        return table[0][positions], table[1][positions]

    def _store(self, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        end = start + k.shape[1]
        if self._k.ndim != 3 or self._k.shape[1] < end:
            cap = max(256, 2 * end)
            nk = k.new_zeros((k.shape[0], cap, k.shape[2]))
            nv = v.new_zeros((v.shape[0], cap, v.shape[2]))
            if self._k.ndim == 3:
                nk[:, : self._length] = self._k[:, : self._length]
                nv[:, : self._length] = self._v[:, : self._length]
            self._k, self._v = nk, nv
        self._k[:, start:end] = k
        self._v[:, start:end] = v
        self._length = end

    def truncate(self, length: int) -> None:
        self._length = min(self._length, max(0, length))


def save_head(head: EagleHead, info: HeadInfo, folder: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    save_file(state, str(folder / "head.safetensors"))
    (folder / "head.json").write_text(info.to_json(), encoding="utf-8")


def read_info(folder: Path) -> HeadInfo:
    path = Path(folder) / "head.json"
    if not path.is_file():
        raise SpeculaError(f"draft head not found: {path}")
    try:
        return HeadInfo.from_json(path.read_text(encoding="utf-8"))
    except (ValueError, TypeError, KeyError) as exc:
        raise SpeculaError(f"draft head description {path} is unreadable: {exc}") from None


def load_head(folder: Path, target, dtype=None, kind: str | None = None) -> tuple[nn.Module, HeadInfo]:
    """The head in `folder` for this loaded target; refuses a head trained for another model."""
    from safetensors.torch import load_file

    folder = Path(folder)
    info = read_info(folder)
    if kind is not None and info.kind != kind:
        raise SpeculaError(f"{folder} holds a {info.kind} head, not the {kind} head this strategy needs")
    kinds = head_kinds()
    if info.format != FORMAT or info.kind not in kinds:
        raise SpeculaError(f"{folder} holds a '{info.kind}' head of format {info.format}; this version reads "
                           f"{' and '.join(kinds)} heads of format {FORMAT}")
    if info.target != target_fingerprint(target.model):
        made_for = f" (made for {info.target_name})" if info.target_name else ""
        raise SpeculaError(f"the draft head in {folder} was trained for another model{made_for}, not {target.name}")
    if target.tokenizer is not None and info.vocabulary != vocabulary_fingerprint(target.tokenizer):
        raise SpeculaError(f"the draft head in {folder} was trained with another tokenizer than {target.name}'s")
    head = kinds[info.kind](info.config)
    weights = folder / "head.safetensors"
    try:
        state = load_file(str(weights))
        if "draft_ids" in state:
            head.draft_ids = state["draft_ids"]
        head.load_state_dict(state)
    except Exception as exc:  # a truncated file, a wrong shape, a missing tensor: all name the file
        raise SpeculaError(f"the draft head {weights} is unreadable: {first_line(exc)[:200]}") from None
    head = head.to(device=target.device, dtype=dtype or target.dtype).eval()
    head.requires_grad_(False)
    return head, info


def head_folders() -> list[Path]:
    """Where heads are looked for: the user's (DATA_DIR/heads/NAME, where `specula train-head` and the
    app write them), then the ones that ship with Specula; a head the user trained comes first."""
    from ..paths import data_dir

    roots = [data_dir() / "heads", Path(__file__).parent / "bundled"]
    return [d for root in roots if root.is_dir() for d in sorted(root.iterdir()) if (d / "head.json").is_file()]


def head_for_strategy(target, head, kind: str, make: str) -> nn.Module:
    """The `kind` head in folder `head` for a strategy of that name, with the messages a user can act on
    when the model is not Llama-family or no head was given (`make`: how to train one)."""
    from ..errors import UnsupportedModelError

    if not target.uses_lean_forward:
        raise UnsupportedModelError(
            f"{kind} supports the Llama family (Llama, Qwen2/3, Mistral, SmolLM), not '{target.model.config.model_type}'"
        )
    if head is None:
        raise SpeculaError(f"strategy '{kind}' needs {make}")
    return load_head(Path(head), target, kind=kind)[0]


def head_kinds() -> dict[str, type]:
    from .medusa import MedusaHead

    return {"eagle": EagleHead, "medusa": MedusaHead}


def readable(folder: Path) -> str | None:
    """Why the head's weights cannot be read (None when they can): their file's header and size are
    checked, which finds a truncated or foreign file without reading the tensors."""
    from safetensors import safe_open

    path = folder / "head.safetensors"
    try:
        with safe_open(str(path), framework="pt") as f:
            if not list(f.keys()):
                return f"the draft head {path} holds no tensors"
    except Exception as exc:
        return f"the draft head {path} is unreadable ({first_line(exc)[:200]})"
    return None


def find_heads(target, skipped: list[str] | None = None) -> dict[str, list[Path]]:
    """Head folders made for this loaded target (its fingerprint and vocabulary) by kind, the user's
    before the shipped ones. A head whose files cannot be read is left out, and `skipped` says which."""
    folders = head_folders()
    if not folders or not target.uses_lean_forward:
        return {}
    try:
        mine = target_fingerprint(target.model)
        vocab = vocabulary_fingerprint(target.tokenizer) if target.tokenizer is not None else None
    except (AttributeError, TypeError, ValueError):  # a model or tokenizer without the usual parts: no heads
        return {}
    found: dict[str, list[Path]] = {}
    for folder in folders:
        try:
            info = read_info(folder)
        except SpeculaError as exc:
            if skipped is not None:
                skipped.append(f"{exc}; it was skipped")
            continue
        if info.kind in head_kinds() and info.target == mine and (vocab is None or info.vocabulary == vocab):
            problem = readable(folder)
            if problem is None:
                found.setdefault(info.kind, []).append(folder)
            elif skipped is not None:
                skipped.append(f"{problem}; it was skipped")
    return found
