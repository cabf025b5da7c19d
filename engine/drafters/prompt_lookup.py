"""`prompt-lookup`: find the conversation's last n tokens earlier in the conversation and propose what
followed them there (Saxena 2023). Longest n first, most recent match first. No distribution: q is
one-hot, so under sampling the acceptance probability of a token is simply p(token)."""

from __future__ import annotations

import torch

from ..errors import SpeculaError
from .base import Draft, DraftContext, empty_draft


def find_continuation(tokens: torch.Tensor, k: int, min_n: int, max_n: int) -> torch.Tensor:
    """tokens (L,) -> up to k tokens that followed the latest earlier occurrence of its suffix."""
    length = tokens.shape[0]
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        windows = tokens[: length - 1].unfold(0, n, 1)  # (L-n, n): window i = tokens[i:i+n]
        hits = (windows == suffix).all(-1).nonzero().flatten()  # starts of earlier occurrences
        if hits.numel():
            start = int(hits[-1]) + n
            return tokens[start : start + k]
    return tokens[:0]


class PromptLookup:
    name = "prompt-lookup"
    description = "copy what followed the latest earlier match of the last n tokens (no extra weights)"

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise SpeculaError(f"prompt lookup needs 1 <= min n <= max n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def reset(self) -> None:
        pass

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        found = find_continuation(ctx.tokens, k, self.min_n, self.max_n)
        return Draft(found.clone()) if found.numel() else empty_draft()

    def observe(self, accepted: int, next_token: int) -> None:
        pass
