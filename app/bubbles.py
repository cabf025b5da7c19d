"""Drawing into the transcript's QTextDocument: framed bubbles with a small header, plain text, notes,
token formats, the summary line and the row of action links. No state beyond the colours and font."""

from __future__ import annotations

from PySide6.QtGui import (
    QColor,
    QFont,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QTextFrame,
    QTextFrameFormat,
)

from specula.app import actions
from specula.app.history import TokenRecord
from specula.app.theme import OriginColours

LINK_GAP = "\u2003"  # an em space between action links


class BubblePainter:
    def __init__(self, document: QTextDocument, colours: OriginColours, font: QFont, dark: bool) -> None:
        self.document, self.colours, self.dark = document, colours, dark
        size = font.pointSizeF()
        self.small = max(7.0, (size if size > 0 else 10.0) * 0.85)

    def open_bubble(self, who: str, background: str, indent_left: bool = False, accent: str | None = None,
                    header: bool = True) -> QTextCursor:
        """A framed block at the end of the document with a small header; returns a cursor inside it."""
        cursor = QTextCursor(self.document)
        cursor.movePosition(QTextCursor.MoveOperation.End)
        frame = QTextFrameFormat()
        frame.setBackground(QColor(background))
        frame.setPadding(10)
        frame.setBorder(1.5 if accent else 1)
        muted = QColor(self.colours.muted)
        frame.setBorderBrush(QColor(accent) if accent else (muted.darker(200) if self.dark else muted.lighter(170)))
        frame.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        frame.setTopMargin(6)
        frame.setBottomMargin(6)
        frame.setLeftMargin(72 if indent_left else 0)
        frame.setRightMargin(0 if indent_left else 72)
        cursor.insertFrame(frame)
        if header:
            self.write_header(cursor, who)
        return cursor

    def write_header(self, cursor: QTextCursor, who: str) -> None:
        """The bubble's caption, then a new block for its body."""
        header = QTextCharFormat()
        header.setFontWeight(QFont.Weight.Bold)
        header.setForeground(QColor(self.colours.muted))
        header.setFontPointSize(self.small)
        cursor.insertText(who, header)
        block = QTextBlockFormat()
        block.setTopMargin(4)
        cursor.insertBlock(block, QTextCharFormat())

    def write_plain(self, cursor: QTextCursor, text: str, colour: str | None = None) -> None:
        fmt = QTextCharFormat()
        if colour:
            fmt.setForeground(QColor(colour))
        cursor.insertText(text, fmt)

    def note_format(self) -> QTextCharFormat:
        """Muted, small, italic: a line about an answer rather than of it."""
        fmt = self._small_format()
        fmt.setFontItalic(True)
        return fmt

    def write_note(self, cursor: QTextCursor, text: str) -> None:
        """A muted italic line at the top of an answer, before its text."""
        cursor.insertText(text, self.note_format())
        block = QTextBlockFormat()
        block.setTopMargin(2)
        cursor.insertBlock(block, QTextCharFormat())

    def token_format(self, rec: TokenRecord, index: int) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setAnchor(True)
        fmt.setAnchorHref(f"t{index}")
        colour = self.colours.of(rec.origin)
        if colour:
            fmt.setForeground(QColor(colour))
        if rec.origin == "rejected":
            fmt.setFontStrikeOut(True)
        return fmt

    def write_summary(self, cursor: QTextCursor, text: str) -> None:
        block = QTextBlockFormat()
        block.setTopMargin(6)
        fmt = self._small_format()
        cursor.insertBlock(block, fmt)
        cursor.insertText(text, fmt)

    def replace_row(self, frame: QTextFrame, links, index: int, had_row: bool) -> None:
        """Make the frame's last block the row of `links` ((name, label) pairs), or remove the row."""
        cursor = frame.lastCursorPosition()
        if had_row:
            cursor.movePosition(QTextCursor.MoveOperation.StartOfBlock, QTextCursor.MoveMode.KeepAnchor)
            if not links:  # the block break before the row goes too
                cursor.movePosition(QTextCursor.MoveOperation.PreviousCharacter, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
        elif links:
            block = QTextBlockFormat()
            block.setTopMargin(4)
            cursor.insertBlock(block, QTextCharFormat())
        for i, (name, label) in enumerate(links):
            if i:
                cursor.insertText(LINK_GAP, self._small_format())
            cursor.insertText(label, self._link_format(name, index) if name else self._small_format())

    def _link_format(self, name: str, index: int) -> QTextCharFormat:
        fmt = self._small_format()
        fmt.setAnchor(True)
        fmt.setAnchorHref(actions.href(name, index))
        fmt.setFontWeight(QFont.Weight.DemiBold)
        return fmt

    def _small_format(self) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(self.colours.muted))
        fmt.setFontPointSize(self.small)
        return fmt
