"""What a trained draft head states about itself, so that the drafters, the measurements and training read it
instead of probing for it: what it reads of the target, which layers, the tokens it may draft, and how it
drafts (and forgets).

- `DraftHead`: every head (`eagle.EagleHead`, `eagle3.Eagle3Head`, `medusa.MedusaHead`,
  `published.PublishedEagle`, `published.PublishedMedusa`);
- `AutoregressiveHead`: heads that draft one token at a time, each prediction fed back in with the next
  token's embedding, over a drafting cache of their own (EAGLE-1/2/3: EagleHead and its subclasses);
- `MultiTokenHead`: heads that guess several tokens ahead at once from one position's state (Medusa).

The heads are torch modules; these protocols name the part of them the rest of the engine relies on.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn as nn


class DraftHead(Protocol):
    # what it reads: the target's hidden states after its final norm (published heads, whose predictions go to
    # an LM head as they are), or before it (Specula's own: the target's final norm goes on the predictions)
    reads_normed: bool
    # which layers: the target layers whose entering hidden states it reads, side by side (EAGLE-3; the target's
    # runner keeps them, `ModelRunner.keep_layers`); (): the target's final hidden states
    aux_layers: tuple[int, ...]
    # the target's ids of the tokens it may draft, in the order of its logits' rows; empty: every token
    draft_ids: torch.Tensor


class AutoregressiveHead(DraftHead, Protocol):
    # its own copy of the target's input embeddings (a published file's), or None: it reads the target's
    embed: nn.Module | None
    # whether its logits come from its own final norm and LM head over its draft vocabulary (`draft_logits`,
    # EAGLE-3); else the drafter puts its predictions through the target's
    own_lm_head: bool

    def __call__(self, features: torch.Tensor, next_embeds: torch.Tensor, start: int = 0,
                 use_cache: bool = False) -> torch.Tensor:
        """features (B, T, F) at positions start.. and the embeddings of the tokens after them (B, T, D) -> its
        outputs (B, T, H), what a draft step feeds back; with use_cache (B = 1) through its drafting cache."""
        ...

    def forward_tree(self, features: torch.Tensor, next_embeds: torch.Tensor, positions: torch.Tensor, slot: int,
                     visible: torch.Tensor) -> torch.Tensor:
        """Tree drafting: rows (n, F) at rotary `positions` into cache slots slot.., each attending to the slots
        `visible` (n, slot + n) marks -> its outputs (n, H)."""
        ...

    def draft_logits(self, outs: torch.Tensor) -> torch.Tensor:
        """(n, H) outputs -> (n, draft vocabulary) fp32 logits, where `own_lm_head`."""
        ...

    def truncate(self, length: int) -> None:
        """Forget its drafting cache after the first `length` positions (rollback to what it read for real)."""
        ...


class MultiTokenHead(DraftHead, Protocol):
    # one block per token guessed: block i guesses the token i + 1 places after the newest one, from the state
    # of the position before it. Heads that read the normed state give logits (`head_logits(state, lm_head)`),
    # the others predicted states for the target's final norm and LM head (calling the head)
    blocks: nn.ModuleList
