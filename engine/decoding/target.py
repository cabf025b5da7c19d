"""What the loop needs of a model: its own KV cache, tokens in at the next positions, logits out,
rollback by truncating.

`ModelRunner` is the only thing the decoder and the model drafters call. Two implementations live in
`models/`: `runner.LeanRunner` (Specula's own forward over its own cache, for every family with a spec) and
`hf.HFRunner` (any transformers causal LM, through its own cache, as the fallback).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .tree import TokenTree


class ModelRunner(Protocol):
    vocab_size: int
    max_len: int  # positions the model can attend over
    device: torch.device
    keeps_features: bool  # features(start, end) gives the last layer's hidden states (feature drafters)
    exact_trees: bool  # a token-tree pass decides as the chain pass of each path would
    # the target layers whose entering hidden states it keeps for every position (`keep_layers`; EAGLE-3
    # heads read them through aux_features(start, end)); () where it keeps none
    aux_layers: tuple[int, ...]

    @property
    def length(self) -> int:
        """Tokens currently held in the cache."""
        ...

    @property
    def step_kind(self) -> str:
        """The step the current answer runs: "compiled", "static" or "eager" (plain steps' times compare
        within one kind only)."""
        ...

    def keep_layers(self, layers: tuple[int, ...]) -> None:
        """From the next prompt on, keep the hidden states entering these layers for every position; () keeps
        none (the loop sets what its drafter reads before each prompt)."""
        ...

    def forward(self, tokens: torch.Tensor, last: int = 1, tree: TokenTree | None = None) -> torch.Tensor:
        """tokens (T,) at positions length .. length+T-1 -> fp32 logits (last, V) of the last rows; with a
        `tree` (runners whose `exact_trees` is set, or that take trees at all) the tokens are its rows."""
        ...

    def truncate(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""
        ...

    def limit_vocab(self, n: int) -> None:
        """From now on, logits over the ids below n only where that saves work (0: every id): a draft model
        drafting from its vocabulary's most frequent tokens. A runner whose product gives every id anyway may
        keep them all."""
        ...

    def reusable(self, ids: torch.Tensor) -> int:
        """How many leading positions of the prompt `ids` (T,) the cache holds as reading it anew would write
        them (kept by the prefill; at most T - 1), 0 where a runner cannot say."""
        ...

    def keep(self, start: int, rows: list[int]) -> None:
        """After a pass that began at `start`: keep its rows `rows` (a root-to-node path, row 0 first) as
        positions start, start+1, ...; drop the rest. For a chain's rows this is a truncation."""
        ...
