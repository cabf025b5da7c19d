"""`prompt-lookup`: find the conversation's last tokens earlier in the conversation and propose what
followed them there (Saxena 2023). The longest match wins, the most recent among equals; the draft is
as long as the evidence for it: twice the match length, at most k (a one-token match proposes two
tokens, a four-token match eight). No distribution: q is one-hot, so under sampling the acceptance
probability of a token is simply p(token)."""

from __future__ import annotations

import numpy as np
import torch

from ..api.errors import SpeculaError
from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft

# extensions of a match taken one at a time (a short match ends in one or two); a longer one, usually a copy of
# the prompt, is followed the rest of the way in one comparison (a long match cost 16 rounds of array calls)
QUICK_STEPS = 2
DRAFT_PER_MATCHED_TOKEN = 2  # measured with the bench's prompts: longer drafts on weak matches cost more than they win


def longest_match(tokens: np.ndarray, max_n: int) -> tuple[int, int]:
    """(n, start): the longest n <= max_n such that the last n tokens occur earlier, and where the
    latest such occurrence's continuation starts. n = 0 when the last token never occurred before."""
    length = tokens.shape[0]
    if length < 2:
        return 0, 0
    ends = np.flatnonzero(tokens[: length - 1] == tokens[-1])  # earlier positions holding the last token
    if ends.size == 0:
        return 0, 0
    n = 1
    while n < max_n:
        if n == QUICK_STEPS + 1:  # still matching: a long copy; the rest for all survivors at once
            return _longer(tokens, ends, n, max_n)
        room = ends[ends >= n]
        longer = room[tokens[room - n] == tokens[length - 1 - n]]  # the match extends one token further back
        if longer.size == 0:
            break
        ends, n = longer, n + 1
    return n, int(ends[-1]) + 1


def _longer(tokens: np.ndarray, ends: np.ndarray, n: int, max_n: int) -> tuple[int, int]:
    """longest_match's search from matches of n tokens ending at `ends`: how much further back each agrees,
    in one comparison of up to max_n - n tokens each."""
    back = np.arange(n, min(max_n, tokens.shape[0] - 1))
    if back.size == 0:
        return n, int(ends[-1]) + 1
    more = agreement(tokens, ends, tokens, back)
    best = int(more.max())
    return n + best, int(ends[more == best][-1]) + 1


def agreement(source: np.ndarray, ends: np.ndarray, tail: np.ndarray, back: np.ndarray) -> np.ndarray:
    """For each of `ends` in `source`: how many of the offsets `back` (in order) agree, source[end - b] with
    tail[-1 - b], before the first that does not (a position before the source's start does not)."""
    at = ends[:, None] - back[None, :]
    same = (at >= 0) & (source[np.maximum(at, 0)] == tail[tail.shape[0] - 1 - back][None, :])
    return np.logical_and.accumulate(same, axis=1).sum(axis=1)


def matched_continuation(tokens: torch.Tensor, k: int, max_n: int) -> tuple[int, torch.Tensor]:
    """tokens (L,) -> (n, the draft): the latest longest earlier match's length and up to min(k, 2n) tokens
    after it (none when n = 0)."""
    n, start = longest_match(tokens.numpy(), max_n)
    return n, continuation(tokens, n, start, k)


def continuation(tokens: torch.Tensor, n: int, start: int, k: int) -> torch.Tensor:
    """The draft after a match of n tokens whose continuation starts at `start` (longest_match's): up to
    min(k, 2n) tokens."""
    return tokens[start : start + min(k, DRAFT_PER_MATCHED_TOKEN * n)]


def find_continuation(tokens: torch.Tensor, k: int, min_n: int, max_n: int) -> torch.Tensor:
    """tokens (L,) -> the draft: up to min(k, 2n) tokens after the latest longest earlier match."""
    n, found = matched_continuation(tokens, k, max_n)
    return found if n >= min_n else tokens[:0]


class PromptLookup(Drafter):
    name = "prompt-lookup"
    description = STRATEGIES[name].description

    def __init__(self, min_n: int = 1, max_n: int = 16) -> None:
        if not 1 <= min_n <= max_n:
            raise SpeculaError(f"prompt lookup needs 1 <= min n <= max n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        found = find_continuation(ctx.tokens, k, self.min_n, self.max_n)
        return Draft(found.clone()) if found.numel() else empty_draft()
