"""Medusa heads (Cai et al. 2024): from the target's final hidden state at position t, head i guesses the
token at t + 2 + i at once, without feeding guesses back. Each head is one residual block,
h + SiLU(W h), read through the target's own final norm and LM head (frozen). The blocks start at zero,
so an untrained head repeats the target's own next-token guess.

Stored like an EAGLE head (head.safetensors + head.json, kind "medusa"); see store.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import HeadConfig


class MedusaHead(nn.Module):
    """A `MultiTokenHead` (protocol.py): it reads the target's final hidden state before the final norm."""

    reads_normed = False
    aux_layers: tuple[int, ...] = ()

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(nn.Linear(config.hidden, config.hidden) for _ in range(config.medusa_heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)
        self.register_buffer("draft_ids", torch.empty(0, dtype=torch.long))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (..., D) -> one predicted feature per head (heads, ..., D), before the final norm."""
        return torch.stack([features + F.silu(block(features)) for block in self.blocks])
