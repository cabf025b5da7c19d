"""An answer as rendered Markdown inside its bubble (Qt's CommonMark + GitHub dialect importer), with
each character still coloured by the token it came from.

Qt marks fenced code blocks (`BlockCodeFence`) and sets them in a monospace font but gives them no
background; here they get a tinted background and some padding, and inline code a tint of its own, so
code reads as code in light and dark themes.

Colours survive rendering because rendering mostly takes characters away (markers, fences, indentation)
and turns line breaks into spaces: the rendered text is aligned with the source text character by
character (`align`), and each run of rendered characters takes the format of the token that produced it.
A user's message is not rendered (it is shown as typed); only its code is set in the monospace font.
"""

from __future__ import annotations

import re

from PySide6.QtGui import QColor, QFontDatabase, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

CODE_BACKGROUND = {False: "#f3f5f8", True: "#262b33"}  # light, dark
# what Qt's importer marks a code block with: a fence (```), or a language (which it sets, empty, on an
# indented block too)
CODE_BLOCK = (QTextFormat.Property.BlockCodeFence, QTextFormat.Property.BlockCodeLanguage)
LOOKAHEAD = 400  # source characters searched for a rendered one (a link's URL is the longest thing dropped)
_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`", re.DOTALL)  # fenced blocks (closed or not) and inline code


def insert_markdown(cursor: QTextCursor, text: str, dark: bool) -> None:
    """Render `text` at `cursor` (inside a bubble) and style its code."""
    start = cursor.position()
    source = text.strip("\n")
    cursor.insertMarkdown(source, QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    if cursor.position() > start and cursor.block().length() <= 1:
        cursor.deletePreviousChar()  # the empty block the importer leaves (an empty bullet after a list)
    if source.lstrip(" ").startswith(("```", "~~~")):
        # the importer's first block merges into the block the cursor was in (the bubble's), which keeps that
        # block's format: an answer that opens with code had its first line outside the code's tinted box
        first = QTextCursor(cursor.document().findBlock(start))
        fmt = first.blockFormat()
        fmt.setProperty(QTextFormat.Property.BlockCodeFence, "`")
        first.setBlockFormat(fmt)
    _style_code(cursor.document(), start, cursor.position(), QColor(CODE_BACKGROUND[dark]))


def insert_coloured_markdown(cursor: QTextCursor, text: str, dark: bool, pieces: list[tuple[str, QTextCharFormat]]
                             ) -> None:
    """Render `text` as Markdown at `cursor`, then give each rendered character the format (colour, hover
    anchor) of the piece of `text` it came from; `pieces` are (text, format) and concatenate to `text`."""
    start = cursor.position()
    insert_markdown(cursor, text, dark)
    end = cursor.position()
    owner = [i for i, (piece, _) in enumerate(pieces) for _ in piece]  # source offset -> piece
    source = "".join(piece for piece, _ in pieces)
    document = cursor.document()
    rendered = "".join(document.characterAt(pos) for pos in range(start, end))
    runs: list[tuple[int, int, int]] = []  # (first position, last position + 1, piece)
    for offset, src in enumerate(align(source.strip("\n"), rendered, skip=len(source) - len(source.lstrip("\n")))):
        if src is None or src >= len(owner):
            continue
        piece, pos = owner[src], start + offset
        if runs and runs[-1][2] == piece and runs[-1][1] == pos:
            runs[-1] = (runs[-1][0], pos + 1, piece)
        else:
            runs.append((pos, pos + 1, piece))
    paint = QTextCursor(document)
    paint.beginEditBlock()  # one layout pass for all the runs, not one each (2,000 runs: 0.5 s -> a few ms)
    for first, last, piece in runs:
        paint.setPosition(first)
        paint.setPosition(last, QTextCursor.MoveMode.KeepAnchor)
        paint.mergeCharFormat(pieces[piece][1])
    paint.endEditBlock()
    cursor.setPosition(end)


def align(source: str, rendered: str, skip: int = 0) -> list[int | None]:
    """For each character of `rendered`, the offset (plus `skip`) of the `source` character it shows, or None.
    Greedy and in order: the nearest next source character that is the same, any white space for white space
    (a paragraph break is U+2029, a soft line break a space)."""
    out: list[int | None] = []
    j = 0
    for ch in rendered:
        space = ch.isspace()
        found = None
        for k in range(j, min(len(source), j + LOOKAHEAD)):
            if source[k] == ch or (space and source[k].isspace()):
                found = k
                break
        if found is None:
            out.append(None)
        else:
            out.append(found + skip)
            j = found + 1
    return out


def insert_with_code(cursor: QTextCursor, text: str, dark: bool) -> None:
    """Insert `text` as typed, with its `code` and fenced blocks in the monospace font on a tint, without their
    backticks and fence lines (the message keeps them: Edit shows it as typed)."""
    plain = QTextCharFormat()
    code = QTextCharFormat()
    code.setFontFamilies([QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()])
    code.setBackground(QColor(CODE_BACKGROUND[dark]))
    at = 0
    for match in _CODE.finditer(text):
        if match.start() > at:
            cursor.insertText(text[at : match.start()], plain)
        cursor.insertText(_inside(match.group(0)), code)
        at = match.end()
    if at < len(text):
        cursor.insertText(text[at:], plain)


def _inside(code: str) -> str:
    """A fenced block's lines without its fences (and the language after the opening one), inline code without
    its backticks."""
    if not code.startswith("```"):
        return code[1:-1]
    body = code[3:]
    body = body[body.index("\n") + 1 :] if "\n" in body else ""  # the opening fence's line, with its language
    if body.endswith("```"):
        body = body[:-3]
    return body.rstrip("\n") or " "


def _style_code(document: QTextDocument, start: int, end: int, background: QColor) -> None:
    batch = QTextCursor(document)
    batch.beginEditBlock()  # one layout pass for every block restyled
    try:
        _style_blocks(document, start, end, background)
    finally:
        batch.endEditBlock()


def _style_blocks(document: QTextDocument, start: int, end: int, background: QColor) -> None:
    block = document.findBlock(start)
    while block.isValid() and block.position() <= end:
        cursor = QTextCursor(block)
        fmt = block.blockFormat()
        if any(fmt.hasProperty(p) for p in CODE_BLOCK):
            fmt.setBackground(background)
            fmt.setLeftMargin(6)
            fmt.setRightMargin(6)
            # a long line of code wraps inside the bubble: unbroken, it widened the whole chat beyond the
            # window and needed a horizontal scroll bar for every message
            fmt.setNonBreakableLines(False)
            cursor.setBlockFormat(fmt)
        else:
            _tint_inline_code(block, background)
        block = block.next()


def _tint_inline_code(block, background: QColor) -> None:
    spans = []  # collected first: formatting a fragment while iterating would split the iteration
    it = block.begin()
    while not it.atEnd():
        fragment = it.fragment()
        if fragment.isValid() and fragment.charFormat().fontFixedPitch():
            spans.append((fragment.position(), fragment.length()))
        it += 1
    code = QTextCharFormat()
    code.setFontFamilies([QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()])
    code.setBackground(background)
    for position, length in spans:
        cursor = QTextCursor(block.document())
        cursor.setPosition(position)
        cursor.setPosition(position + length, QTextCursor.MoveMode.KeepAnchor)
        cursor.mergeCharFormat(code)
