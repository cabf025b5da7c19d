"""A draft model's cut vocabulary: logits over the ids below a bound only, the tokens its target mostly emits. A
byte-pair vocabulary numbers its tokens in the order their merges were learned, most frequent first, so the lowest ids
are the common ones. Where the LM head is a file's blocks, only those rows are read (the 0.5B Qwen2.5's head over
151,936 ids is over a third of the bytes a step reads); elsewhere the logits are cut after the product."""

from __future__ import annotations

import torch

from ..cpu.products import TILE_COLS, Blocks


class VocabCut:
    """The first `rows` ids of a vocabulary of `size` (0: all of them)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rows = 0
        self._cut: tuple | None = None  # (the file's LM head blocks, their first `rows` outputs)

    def limit(self, n: int) -> None:
        """Logits over the ids below n only (0: all); n is rounded up to a whole tile of the packed head."""
        n = max(0, int(n))
        self.rows = 0 if n == 0 or n >= self.size else min(self.size, -(-n // TILE_COLS) * TILE_COLS)
        self._cut = None

    def product(self, product):
        """The LM head product a pass runs: a file's blocks cut to their first `rows` outputs; any other head as it is
        (`logits` cuts what it gives)."""
        if not self.rows or not isinstance(product, Blocks):
            return product
        if self._cut is None or self._cut[0] is not product:
            try:
                cut = product.first_rows(self.rows)
            except ValueError:  # a head of several parts or with a bias: cut after the product
                cut = product
            self._cut = (product, cut)
        return self._cut[1]

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(rows, V) -> (rows, `rows`) where the vocabulary is cut and the product gave every id."""
        return logits[:, : self.rows] if self.rows and logits.shape[-1] > self.rows else logits
