"""Logits -> probabilities, and the draws made from them.

The same `process_logits` builds the target's distribution p and a drafter's q, so the acceptance rule
in `verify.py` compares like with like (same temperature, top-k and top-p).
"""

from __future__ import annotations

import torch

from ..api.types import SamplingParams  # re-exported: the engine's modules import it from here


def process_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(..., V) logits -> (..., V) probabilities after temperature, top-k, then top-p.

    Greedy requests get a one-hot distribution on the argmax, so probabilities shown to the user stay
    meaningful and the acceptance rule degenerates to exact matching.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already cover top_p; the first always stays
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """(..., V) probabilities -> (...) token ids, drawn with the request's generator."""
    flat = probs.reshape(-1, probs.shape[-1])
    picks = torch.multinomial(flat, 1, generator=generator)  # (N, 1)
    return picks.reshape(probs.shape[:-1])


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """(..., V) logits -> (...) token ids: argmax when greedy, else a draw from the processed p."""
    if params.greedy:
        return logits.argmax(-1)
    return sample(process_logits(logits, params), generator)
