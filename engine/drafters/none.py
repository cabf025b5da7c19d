"""`none`: drafts nothing, so every step is one plain decoding step of the target (the baseline)."""

from __future__ import annotations

from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft


class NoDraft(Drafter):
    name = "none"
    chooses_length = True  # it drafts nothing: no length to choose
    description = STRATEGIES[name].description

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        return empty_draft()
