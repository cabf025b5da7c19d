"""`none`: drafts nothing, so every step is one plain decoding step of the target (the baseline)."""

from __future__ import annotations

from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, empty_draft


class NoDraft:
    name = "none"
    learns_from_tree = False
    chooses_length = True  # it drafts nothing: no length to choose
    description = STRATEGIES[name].description

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return empty_draft()

    def observe(self, accepted: int, next_token: int) -> None:
        pass

    def observe_step(self, drafted: int, accepted: int, seconds: float) -> None:
        pass
