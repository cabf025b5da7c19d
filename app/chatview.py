"""The transcript: user and assistant turns as bubbles; assistant tokens coloured by origin.

Streaming appends at a cursor kept at the end of the current answer (nothing is re-rendered per
token). Each token is an anchor `t<index>` into `records`, so hovering shows its origin, step, draft
position and p/q. Rejected draft tokens are struck-through ghost text placed where they were rejected;
hiding them (or a palette change) re-renders the conversation once.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPoint
from PySide6.QtGui import QColor, QFont, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextFrameFormat
from PySide6.QtWidgets import QFrame, QTextBrowser, QToolTip

from .history import TokenRecord, Turn
from .theme import OriginColours, palette_for
from .tokens import tooltip

PLACEHOLDER = "Ask anything. Each token shows where it came from; hover one for details."


class ChatView(QTextBrowser):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setPlaceholderText(PLACEHOLDER)
        self.document().setDocumentMargin(14)
        self.show_ghosts = True
        self.records: list[TokenRecord] = []  # anchor index -> token
        self._turns: list[Turn] = []  # what is shown, for re-rendering
        self._live: list[TokenRecord] | None = None  # the answer being streamed
        self._stream: QTextCursor | None = None
        self._colours = self._pick_colours()

    # -- public -------------------------------------------------------------------------------------
    @property
    def colours(self) -> OriginColours:
        return self._colours

    def show_turns(self, turns) -> None:
        """Replace the transcript with a conversation's turns."""
        self._turns = list(turns)
        self._live = None
        self._rerender()

    def add_turn(self, turn: Turn) -> None:
        self._turns.append(turn)
        with self._keep_bottom():
            self._render_turn(turn)

    def begin_answer(self) -> None:
        self._live = []
        with self._keep_bottom():
            self._stream = self._open_bubble("Assistant", self._colours.assistant_bubble)

    def append_tokens(self, records: list[TokenRecord]) -> None:
        if self._live is None:
            self.begin_answer()
        self._live.extend(records)
        with self._keep_bottom():
            self._write_tokens(self._stream, records)

    def end_answer(self, turn: Turn) -> None:
        """The streamed answer is complete: add its summary line and keep it as a turn."""
        self._turns.append(turn)
        self._live = None
        if self._stream is not None and turn.summary:
            with self._keep_bottom():
                self._write_summary(self._stream, turn.summary)
        self._stream = None

    def set_show_ghosts(self, show: bool) -> None:
        if show != self.show_ghosts:
            self.show_ghosts = show
            self._rerender()

    def token_at(self, pos: QPoint) -> TokenRecord | None:
        """The token under a viewport position, if any."""
        return self.token_at_href(self.anchorAt(pos))

    def token_at_href(self, href: str) -> TokenRecord | None:
        if href.startswith("t") and href[1:].isdigit() and int(href[1:]) < len(self.records):
            return self.records[int(href[1:])]
        return None

    # -- Qt -----------------------------------------------------------------------------------------
    def viewportEvent(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            rec = self.token_at(event.pos())
            if rec is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), tooltip(rec), self.viewport())
            return True
        return super().viewportEvent(event)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            colours = self._pick_colours()
            if colours != self._colours:
                self._colours = colours
                self._rerender()

    # -- rendering ----------------------------------------------------------------------------------
    def _pick_colours(self) -> OriginColours:
        return palette_for(self.palette().color(QPalette.ColorRole.Base).lightness() < 128)

    def _rerender(self) -> None:
        self.document().clear()
        self.records = []
        self._stream = None
        for turn in self._turns:
            self._render_turn(turn)
        if self._live is not None:
            self._stream = self._open_bubble("Assistant", self._colours.assistant_bubble)
            self._write_tokens(self._stream, self._live)
        self._scroll_to_bottom()

    def _render_turn(self, turn: Turn) -> None:
        c = self._colours
        if turn.role == "user":
            cursor = self._open_bubble("You", c.user_bubble, indent_left=True)
            cursor.insertText(turn.content, QTextCharFormat())
        elif turn.role == "error":
            cursor = self._open_bubble("Error", c.error_bubble)
            fmt = QTextCharFormat()
            fmt.setForeground(QColor(c.error_text))
            cursor.insertText(turn.content, fmt)
        else:
            cursor = self._open_bubble("Assistant", c.assistant_bubble)
            if turn.tokens:
                self._write_tokens(cursor, list(turn.tokens))
            else:
                cursor.insertText(turn.content, QTextCharFormat())
            if turn.summary:
                self._write_summary(cursor, turn.summary)

    def _open_bubble(self, who: str, background: str, indent_left: bool = False) -> QTextCursor:
        """A framed block at the end of the document with a small header; returns a cursor inside it."""
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        frame = QTextFrameFormat()
        frame.setBackground(QColor(background))
        frame.setPadding(10)
        frame.setBorder(1)
        frame.setBorderBrush(QColor(self._colours.muted).lighter(170) if not self._is_dark()
                             else QColor(self._colours.muted).darker(200))
        frame.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
        frame.setTopMargin(6)
        frame.setBottomMargin(6)
        frame.setLeftMargin(72 if indent_left else 0)
        frame.setRightMargin(0 if indent_left else 72)
        cursor.insertFrame(frame)
        header = QTextCharFormat()
        header.setFontWeight(QFont.Weight.Bold)
        header.setForeground(QColor(self._colours.muted))
        header.setFontPointSize(self._small_size())
        cursor.insertText(who, header)
        block = QTextBlockFormat()
        block.setTopMargin(4)
        cursor.insertBlock(block, QTextCharFormat())
        return cursor

    def _write_tokens(self, cursor: QTextCursor, records: list[TokenRecord]) -> None:
        for rec in records:
            index = len(self.records)
            self.records.append(rec)
            if not rec.text or (rec.origin == "rejected" and not self.show_ghosts):
                continue
            cursor.insertText(rec.text, self._token_format(rec, index))

    def _token_format(self, rec: TokenRecord, index: int) -> QTextCharFormat:
        fmt = QTextCharFormat()
        fmt.setAnchor(True)
        fmt.setAnchorHref(f"t{index}")
        colour = self._colours.of(rec.origin)
        if colour:
            fmt.setForeground(QColor(colour))
        if rec.origin == "rejected":
            fmt.setFontStrikeOut(True)
        return fmt

    def _write_summary(self, cursor: QTextCursor, text: str) -> None:
        block = QTextBlockFormat()
        block.setTopMargin(6)
        fmt = QTextCharFormat()
        fmt.setForeground(QColor(self._colours.muted))
        fmt.setFontPointSize(self._small_size())
        cursor.insertBlock(block, fmt)
        cursor.insertText(text, fmt)

    def _small_size(self) -> float:
        size = self.font().pointSizeF()
        return max(7.0, (size if size > 0 else 10.0) * 0.85)

    def _is_dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    # -- scrolling ----------------------------------------------------------------------------------
    def _keep_bottom(self):
        return _StickToBottom(self)

    def _scroll_to_bottom(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())


class _StickToBottom:
    """Follow the stream only when the user was already at the bottom (reading back stays put)."""

    def __init__(self, view: ChatView) -> None:
        self.view = view

    def __enter__(self) -> None:
        bar = self.view.verticalScrollBar()
        self.was_at_bottom = bar.value() >= bar.maximum() - 8

    def __exit__(self, *exc) -> None:
        if self.was_at_bottom:
            self.view._scroll_to_bottom()
