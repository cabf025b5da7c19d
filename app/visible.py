"""Text as the window shows it: the characters that would act on the view instead of showing are shown as marks.

A right-to-left override (U+202E) in a message reversed the text after it, in the chat and in the chat list, and
control characters showed as empty boxes (or not at all). Shown here: the bidirectional embeddings, overrides and
isolates as their code point ("⟨U+202E⟩"), and the control characters as the Unicode control pictures ("␁", "␛";
those above 127 as their code point). Tabs and line breaks stay; a carriage return is left out (a line break
follows it, or the lines join). The stored text is never changed: Copy and Edit give it as it was written.

Each character is mapped alone, so the pieces of a text (an answer's tokens) map to the pieces of the whole.
"""

from __future__ import annotations

import re

BIDI = (*range(0x202A, 0x202F), *range(0x2066, 0x206A))  # LRE, RLE, PDF, LRO, RLO; LRI, RLI, FSI, PDI


def _table() -> dict[int, str]:
    table: dict[int, str] = {code: chr(0x2400 + code) for code in range(0x20) if chr(code) not in "\t\n"}
    table[0x0D] = ""
    table[0x7F] = "\u2421"  # ␡
    table.update({code: f"⟨U+{code:04X}⟩" for code in (*range(0x80, 0xA0), *BIDI)})
    return table


TABLE = _table()
_ACTING = re.compile("[" + "".join(re.escape(chr(code)) for code in TABLE) + "]")


def shown(text: str) -> str:
    """`text` with the characters that act on the view (bidi controls, control characters) as visible marks."""
    return text.translate(TABLE) if _ACTING.search(text) else text  # most texts have none: found at C speed
