"""Incremental detokenizer: token ids in, text pieces out, never half a UTF-8 character.

Each new piece is the difference between decoding a short window of recent tokens with and without
the new ones (the window start absorbs tokenizers that drop a leading space). A piece ending in the
replacement character means an incomplete byte sequence: it is held back until the next token
completes it. The pieces concatenate to `tokenizer.decode(all_ids)`; `flush()` returns whatever a
final full decode still adds (an incomplete character at the very end, for instance).
"""

from __future__ import annotations

_WINDOW = 6  # tokens of left context kept when decoding a piece


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._prefix = 0  # window start
        self._read = 0  # tokens whose text has been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it completes (possibly empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if after.endswith("\ufffd") or not after.startswith(before):
            return ""
        piece = after[len(before) :]
        self._read = len(self.ids)
        self._prefix = max(0, self._read - _WINDOW)
        self.text += piece
        return piece

    def flush(self) -> str:
        """Text still owed at the end of a generation so pieces add up to the full decode."""
        full = self._decode(self.ids)
        piece = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += piece
        self._read = len(self.ids)
        return piece
