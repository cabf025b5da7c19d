"""Draft heads on disk: DIR/head.safetensors (weights) and DIR/head.json (`config.HeadInfo`); saved,
read, checked against the loaded target, and found in the user's heads folder and the bundled ones."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from ..api.errors import SpeculaError, first_line
from ..api.paths import data_dir
from ..cpu.products import GROUP, Blocks, Dense, FileBlocks, can_prepack
from . import native
from .config import FORMAT, HeadConfig, HeadInfo, check_draft_ids, misfit, target_fingerprint, vocabulary_fingerprint
from .eagle import EagleHead
from .eagle3 import Eagle3Head
from .medusa import MedusaHead


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
    except RecursionError:  # Python's reader stops at about a thousand levels
        raise SpeculaError(f"draft head description {path} is unreadable: it nests lists or objects too deeply (the "
                           "file is damaged)") from None


def load_head(folder: Path, target, dtype=None, kind: str | None = None) -> tuple[nn.Module, HeadInfo]:
    """The head in `folder` for this loaded target; refuses a head trained for another model. A folder
    with a published head's config.json instead of head.json is read as published (`published.py`)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / "head.json").is_file() and (folder / "config.json").is_file():
        from .published import load_published  # a head as EAGLE's or Medusa's project publishes it

        return load_published(folder, target, dtype, kind)
    info = read_info(folder)
    if kind is not None and info.kind != kind:
        raise SpeculaError(f"{folder} holds a {info.kind} head, not the {kind} head this strategy needs")
    kinds = head_kinds()
    if info.format != FORMAT or info.kind not in kinds:
        raise SpeculaError(f"{folder} holds a '{info.kind}' head of format {info.format}; this version reads "
                           f"{' and '.join(kinds)} heads of format {FORMAT}")
    if info.target != target_fingerprint(target.model):
        if info.target_name and info.target_name == target.name:  # the same name, other weights
            raise SpeculaError(f"the draft head in {folder} was trained for another model named {target.name}: its "
                               "weights differ from the loaded one's (another file, quantization or fine-tune)")
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
        wrong = misfit(head, state)
        if wrong is None:
            head.load_state_dict(state)
    except Exception as exc:  # a truncated file, not safetensors: all name the file
        raise SpeculaError(f"the draft head {weights} is unreadable: {first_line(exc)[:200]}") from None
    if wrong is not None:
        raise SpeculaError(f"the draft head {weights} does not fit its head.json: {wrong}")
    check_draft_ids(head.draft_ids, target, weights)
    head = head.to(device=target.device, dtype=dtype or target.dtype).eval()
    head.requires_grad_(False)
    return head, info


def heads_roots() -> tuple[Path, Path]:
    """The user's heads folder (DATA_DIR/heads) and the shipped one: where heads (and phrase tables) are found."""
    return data_dir() / "heads", Path(__file__).parent / "bundled"


def fingerprints(target) -> tuple[str, str | None] | None:
    """The loaded target's fingerprint and its tokenizer's (None without a tokenizer), which a head or a phrase
    table made for it records; None for a model or tokenizer without the usual parts."""
    try:
        return (target_fingerprint(target.model),
                vocabulary_fingerprint(target.tokenizer) if target.tokenizer is not None else None)
    except (AttributeError, TypeError, ValueError):
        return None


def head_folders() -> list[Path]:
    """Where heads are looked for: the user's (DATA_DIR/heads/NAME, where `specula train-head` and the
    app write them, and where a head others published may be put as it was downloaded: its config.json and
    weights), then the ones that ship with Specula; a head in the user's folder comes first."""
    user, bundled = heads_roots()
    found = []
    for root in (user, bundled):
        if root.is_dir():
            found += [d for d in sorted(root.iterdir())
                      if (d / "head.json").is_file() or (root == user and (d / "config.json").is_file())]
    return found


def head_for_strategy(target, head, kind: str, make: str) -> nn.Module:
    """The `kind` head in folder `head` for a strategy of that name, with the messages a user can act on
    when the model is not Llama-family or no head was given (`make`: how to train one)."""
    target.require_lean(kind)
    if head is None:
        raise SpeculaError(f"strategy '{kind}' needs {make}")
    return for_drafting(load_head(Path(head), target, kind=kind)[0])


class _Product(nn.Module):
    """An nn.Linear whose product is one of `cpu.products`' fast forms, for inference only: prepacked for
    oneDNN (`Dense`), or the weight quantized to blocks (`HEAD_BLOCKS`) through the compiled step's products
    (`Blocks`). The weight stays as the module's parameter (its dtype and device are read)."""

    def __init__(self, linear: nn.Linear, ops=None, blocks: str | None = None) -> None:
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias
        bias = None if linear.bias is None else linear.bias.detach()
        if blocks is not None and ops is not None:
            self.product = Blocks(ops, [FileBlocks.quantize(linear.weight.detach().float(), blocks)], bias)
        else:
            self.product = Dense(linear.weight.detach(), bias, prepack=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim == 2:
            return self.product(x)
        return self.product(x.reshape(-1, x.shape[-1])).view(*x.shape[:-1], -1)


# Drafting reads the head's weights once per draft token, after the target's step has pushed them out of the
# CPU's caches: in 4-bit blocks (Q4_1, a scale and a minimum per 32 weights) they are a quarter of the bytes of
# bf16. Against 8-bit blocks a tree of 16 nodes takes 24% less time to draft and keeps 1% fewer tokens
# (docs/bench/history/2026-12-03.md, "The head in 4-bit blocks"; "A cheaper head step" for 8-bit against bf16)
HEAD_BLOCKS = "Q4_1"
# an EAGLE head's decoder layer in one call of the compiled step (`native.py`), where its products are blocks
NATIVE_LAYER = True
_LAYER_PRODUCTS = {"q", "k", "v", "o", "gate", "up", "down"}


def for_drafting(head: nn.Module) -> nn.Module:
    """A head loaded for a strategy, its linear products in their fastest form where one applies (a CPU, bf16
    or fp32): 4-bit blocks through the compiled step's products once that library is loaded (bf16), an EAGLE
    head's decoder layer then in one call of it (`native.py`); else prepacked for oneDNN. Never for training:
    the fast copy does not follow the weights. The drafts may round otherwise than the head's own products;
    what the target keeps does not depend on them."""
    from ..cpu import step

    weight = next(head.parameters())
    # blocks wherever the library is loaded: also on CPUs where oneDNN has no bf16 kernels (AVX2 only), whose
    # dense bf16 products are the slowest form there
    ops = step.ops() if weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and HEAD_BLOCKS else None
    if ops is None and not can_prepack(weight):
        return head
    if ops is not None and NATIVE_LAYER and isinstance(head, EagleHead) and native.applies(head):
        head.native = native.NativeLayer(ops, head, HEAD_BLOCKS)
    for name, module in list(head.named_modules()):
        if isinstance(head, EagleHead) and head.native is not None and name in _LAYER_PRODUCTS:
            continue  # run by the native layer
        if isinstance(module, nn.Linear):
            parent_name, _, attr = name.rpartition(".")
            blocks = HEAD_BLOCKS if module.in_features % GROUP == 0 else None  # whole blocks of 32
            setattr(head.get_submodule(parent_name) if parent_name else head, attr, _Product(module, ops, blocks))
    return head.eval().requires_grad_(False)


def _eagle(config: HeadConfig) -> EagleHead:
    """An eagle head of the form its config gives: EAGLE-3 where it reads target layers, else EAGLE-1."""
    return Eagle3Head(config) if config.aux_layers else EagleHead(config)


def head_kinds() -> dict[str, Callable[[HeadConfig], nn.Module]]:
    return {"eagle": _eagle, "medusa": MedusaHead}


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
    prints = fingerprints(target)
    if prints is None:  # a model or tokenizer without the usual parts: no heads
        return {}
    mine, vocab = prints
    found: dict[str, list[Path]] = {}
    for folder in folders:
        if not (folder / "head.json").is_file():  # a published head: no fingerprints, so it is tried on the model
            _find_published(folder, target, found, skipped)
            continue
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


def _find_published(folder: Path, target, found: dict[str, list[Path]], skipped: list[str] | None) -> None:
    """A published head in the user's heads folder, under its strategy where it loads for this target; a folder
    holding no head (a config.json alone) or one made for a model of another size is passed over without a
    word, any other that does not load is named in `skipped` with the loader's reason."""
    from .published import ANOTHER_MODEL, fits, published_kind

    try:
        kind = published_kind(folder)
        if kind is None:
            return
        problem = fits(folder, target, kind)
    except SpeculaError as exc:  # an unreadable config.json or weights
        problem = str(exc)
    if problem is None:
        found.setdefault("medusa" if kind == "medusa" else "eagle", []).append(folder)
    elif problem != ANOTHER_MODEL and skipped is not None:
        skipped.append(f"{problem}; it was skipped")
