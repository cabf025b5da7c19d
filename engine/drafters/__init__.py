"""Draft strategies behind one interface, and the public registry the CLI, GUI and bench list.

`DRAFTERS[name]` describes a strategy; `build_drafter(name, target, draft, **options)` makes one for a
loaded target (and draft model, where the strategy needs one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..api.errors import SpeculaError
from ..api.strategies import STRATEGIES, StrategyCard, default_k
from ..decoding.drafter import Draft, DraftContext, Drafter
from .auto import Auto
from .draft_model import DraftModel
from .eagle import Eagle
from .layer_skip import LayerSkip
from .lookahead import Lookahead
from .medusa import Medusa
from .none import NoDraft
from .prompt_lookup import PromptLookup
from .suffix import Suffix


@dataclass(frozen=True)
class StrategyInfo(StrategyCard):
    """A catalogue entry (strategies.STRATEGIES) with the code that builds the drafter."""

    build: Callable[..., Drafter] | None = None


def _prompt_lookup(target, draft=None, min_n=None, max_n=None, **options):
    return PromptLookup(min_n=min_n or 1, max_n=max_n or 16)


_BUILDERS: dict[str, Callable[..., Drafter]] = {
    NoDraft.name: lambda target, draft=None, **options: NoDraft(),
    PromptLookup.name: _prompt_lookup,
    DraftModel.name: DraftModel.build,
    LayerSkip.name: LayerSkip.build,
    Eagle.name: Eagle.build,
    Medusa.name: Medusa.build,
    Lookahead.name: Lookahead.build,
    Suffix.name: Suffix.build,
    Auto.name: Auto.build,
}
DRAFTERS: dict[str, StrategyInfo] = {name: StrategyInfo(**vars(card), build=_BUILDERS[name])
                                     for name, card in STRATEGIES.items()}


def strategy_names() -> tuple[str, ...]:
    return tuple(DRAFTERS)


def build_drafter(name: str, target, draft=None, **options) -> Drafter:
    if name not in DRAFTERS:
        raise SpeculaError(f"unknown strategy '{name}': choose one of {', '.join(DRAFTERS)}")
    return DRAFTERS[name].build(target, draft, **options)


__all__ = ["DRAFTERS", "Draft", "DraftContext", "Drafter", "StrategyInfo", "build_drafter", "default_k", "strategy_names"]
