"""An answer as rendered Markdown inside its bubble (Qt's CommonMark + GitHub dialect importer).

Qt marks fenced code blocks (`BlockCodeFence`) and sets them in a monospace font but gives them no
background; here they get a tinted background and some padding, and inline code a tint of its own, so
code reads as code in light and dark themes.
"""

from __future__ import annotations

from PySide6.QtGui import QColor, QFontDatabase, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat

CODE_BACKGROUND = {False: "#f3f5f8", True: "#262b33"}  # light, dark


def insert_markdown(cursor: QTextCursor, text: str, dark: bool) -> None:
    """Render `text` at `cursor` (inside a bubble) and style its code."""
    start = cursor.position()
    cursor.insertMarkdown(text.strip("\n"), QTextDocument.MarkdownFeature.MarkdownDialectGitHub)
    if cursor.position() > start and cursor.block().length() <= 1:
        cursor.deletePreviousChar()  # the empty block the importer leaves (an empty bullet after a list)
    _style_code(cursor.document(), start, cursor.position(), QColor(CODE_BACKGROUND[dark]))


def _style_code(document: QTextDocument, start: int, end: int, background: QColor) -> None:
    block = document.findBlock(start)
    while block.isValid() and block.position() <= end:
        cursor = QTextCursor(block)
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
            fmt = block.blockFormat()
            fmt.setBackground(background)
            fmt.setLeftMargin(6)
            fmt.setRightMargin(6)
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
