"""Draft strategies behind one interface, and the public registry the CLI, GUI and bench list.

`DRAFTERS[name]` describes a strategy; `build_drafter(name, target, draft, **options)` makes one for a
loaded target (and draft model, where the strategy needs one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import SpeculaError
from .auto import Auto
from .base import Draft, DraftContext, Drafter
from .draft_model import DraftModel
from .eagle import Eagle
from .layer_skip import LayerSkip
from .lookahead import Lookahead
from .medusa import Medusa
from .none import NoDraft
from .prompt_lookup import PromptLookup


@dataclass(frozen=True)
class StrategyInfo:
    name: str
    description: str
    build: Callable[..., Drafter]
    needs_draft_model: bool = False
    default_k: int = 4  # draft length when the user sets none
    needs_head: str = ""  # the kind of trained draft head it needs (`specula train-head --kind KIND`)
    uses_heads: bool = False  # takes every head found for the model (option "heads"), needs none


def default_k(strategy: str) -> int:
    info = DRAFTERS.get(strategy)
    return info.default_k if info else 4


def _prompt_lookup(target, draft=None, min_n=None, max_n=None, **options):
    return PromptLookup(min_n=min_n or 1, max_n=max_n or 16)


DRAFTERS: dict[str, StrategyInfo] = {
    info.name: info
    for info in (
        StrategyInfo(NoDraft.name, NoDraft.description, lambda target, draft=None, **options: NoDraft()),
        # its drafts shrink to twice the match length on their own, so a higher cap only pays
        StrategyInfo(PromptLookup.name, PromptLookup.description, _prompt_lookup, default_k=8),
        StrategyInfo(DraftModel.name, DraftModel.description, DraftModel.build, needs_draft_model=True),
        StrategyInfo(LayerSkip.name, LayerSkip.description, LayerSkip.build),
        StrategyInfo(Eagle.name, Eagle.description, Eagle.build, needs_head="eagle", default_k=6),
        StrategyInfo(Medusa.name, Medusa.description, Medusa.build, needs_head="medusa", default_k=4),
        StrategyInfo(Lookahead.name, Lookahead.description, Lookahead.build, default_k=5),
        StrategyInfo(Auto.name, Auto.description, Auto.build, uses_heads=True, default_k=8),
    )
}


def strategy_names() -> tuple[str, ...]:
    return tuple(DRAFTERS)


def build_drafter(name: str, target, draft=None, **options) -> Drafter:
    if name not in DRAFTERS:
        raise SpeculaError(f"unknown strategy '{name}': choose one of {', '.join(DRAFTERS)}")
    return DRAFTERS[name].build(target, draft, **options)


__all__ = ["DRAFTERS", "Draft", "DraftContext", "Drafter", "StrategyInfo", "build_drafter", "default_k", "strategy_names"]
