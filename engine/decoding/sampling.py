"""Logits -> probabilities, and the draws made from them.

The same `process_logits` builds the target's distribution p and a drafter's q, so the acceptance rule
in `verify.py` compares like with like (same temperature, top-k and top-p). Batched plain decoding
(`batched.py`) draws each row from its most likely tokens instead (`draw_top_p`): the same distribution
without sorting the whole vocabulary.
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


def top_p_prefix(logits: torch.Tensor, params: SamplingParams,
                 prefix: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, V) logits -> the temperature and top-p distribution (no top-k) over each row's `prefix` most likely
    tokens: their ids (B, K), their probabilities (B, K) (zero for the ones top-p drops) and whether the prefix
    holds all that top-p keeps (B,). About a tenth of the time of sorting the whole vocabulary.

    The distribution is process_logits's up to rounding, but not its arithmetic (a top-k of the scaled logits
    and a logsumexp here, a sort and a softmax over the vocabulary there), and a draw from K probabilities is
    not a draw from V: for a seed the tokens drawn differ, so batched decoding keeps this arithmetic."""
    scaled = logits.float() / params.temperature
    top, ids = scaled.topk(min(prefix, scaled.shape[-1]), dim=-1)  # most likely first
    probs = (top - torch.logsumexp(scaled, -1, keepdim=True)).exp()
    before = probs.cumsum(-1) - probs  # each token's mass of the tokens ranked above it
    kept = probs.masked_fill(before >= params.top_p, 0.0)
    return ids, kept / kept.sum(-1, keepdim=True), before[:, -1] + probs[:, -1] >= params.top_p


def draw_top_p(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> list[int]:
    """One draw per row of (B, V) logits from the temperature and top-p distribution, each row with its own
    generator, from its most likely tokens (`top_p_prefix`); a row whose prefix does not reach top-p, or
    params with a top-k, are drawn from the full sort (`process_logits`)."""
    if params.top_k:
        return [int(sample(process_logits(logits[b], params), gen)) for b, gen in enumerate(generators)]
    ids, kept, covered = top_p_prefix(logits, params)
    return [int(ids[b, torch.multinomial(kept[b], 1, generator=gen)]) if covered[b]
            else int(sample(process_logits(logits[b], params), gen)) for b, gen in enumerate(generators)]
