"""The catalogue of draft strategies, without torch: names, what each does, what it needs, its default
draft length. `drafters.DRAFTERS` adds the code that builds each; the app and clients read this one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StrategyCard:
    name: str
    description: str
    needs_draft_model: bool = False
    default_k: int = 4  # draft length when the user sets none
    needs_head: str = ""  # the kind of trained draft head it needs (`specula train-head --kind KIND`)
    uses_heads: bool = False  # takes every head found for the model (option "heads"), needs none

    @property
    def needs(self) -> str | None:
        """What a model must have for this strategy, in words; None when nothing."""
        if self.needs_draft_model:
            return "a draft model"
        return f"a trained {self.needs_head} head" if self.needs_head else None


STRATEGIES: dict[str, StrategyCard] = {
    card.name: card
    for card in (
        StrategyCard("none", "plain decoding through the same loop (the baseline)"),
        # its drafts shrink to twice the match length on their own, so a higher cap only pays
        StrategyCard("prompt-lookup", "copy what followed the latest longest earlier match of the last tokens "
                                      "(no extra weights)", default_k=8),
        StrategyCard("draft-model", "a smaller model with the same tokenizer drafts (needs --draft-model)",
                     needs_draft_model=True),
        StrategyCard("layer-skip", "the target's first layers draft for the whole model (no extra weights)"),
        StrategyCard("eagle", "a trained head drafts from the target's own features (needs --head DIR from "
                              "`specula train-head`)", needs_head="eagle", default_k=6),
        StrategyCard("medusa", "trained heads guess several tokens at once from the target's last feature, "
                               "verified as a token tree", needs_head="medusa", default_k=4),
        StrategyCard("lookahead", "Jacobi iteration on a window of guesses plus a pool of n-grams collected from "
                                  "it (no extra weights)", default_k=5),
        StrategyCard("auto", "chooses each step's drafter (prompt lookup, lookahead, trained heads) and draft "
                             "length, or no draft, by the speed each has measured here", uses_heads=True,
                     default_k=8),
    )
}


def default_k(strategy: str) -> int:
    card = STRATEGIES.get(strategy)
    return card.default_k if card else 4
