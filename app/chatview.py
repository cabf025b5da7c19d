"""The transcript: user and assistant turns as bubbles; assistant tokens coloured by origin.

Streaming appends at a cursor kept at the end of the current answer (nothing is re-rendered per
token). Each token is an anchor `t<index>` into `records`, so hovering shows its origin, step, draft
position and p/q. Rejected draft tokens are struck-through ghost text placed where they were rejected;
hiding them (or a palette change, or switching an answer between tokens and Markdown) re-renders the
conversation once.

Items are the conversation's turns plus view-only ones: comparison cards and errors that are not part
of the conversation (`transient`). Under each turn a row of small links (`actions.py`) offers Edit,
Copy, Markdown/Tokens, Regenerate or Retry; clicking one emits `action_requested(name, item index)`.
The same actions are in the bubble's context menu.

A long conversation opens at its end: only its last turns are drawn (about SHOWN_TOKENS tokens, which
takes well under a tenth of a second), under a "Show earlier messages" link that draws more, a page at
a time. Drawing a 200-token answer costs a few tens of milliseconds, so a conversation of thousands of
turns drawn whole would hold the window for minutes.
"""

from __future__ import annotations

import time
from itertools import accumulate

from PySide6.QtCore import QEvent, QPoint, QTimer, QUrl, Signal
from PySide6.QtGui import QTextCursor, QTextFrame
from PySide6.QtWidgets import QFrame, QTextBrowser, QToolTip

from specula.app import actions
from specula.app.bubbles import BubblePainter
from specula.app.compare import Comparison
from specula.app.comparecard import card_html, card_title
from specula.app.history import TokenRecord, Turn
from specula.app.markdown import insert_coloured_markdown, insert_markdown, insert_with_code
from specula.app.theme import OriginColours, is_dark, palette_for
from specula.app.tokens import tooltip
from specula.app.visible import shown

FLUSH_MS = 100  # streamed tokens reach the transcript at most this often
# a streamed answer shown as Markdown is rendered again at most this often (its new tokens as they come between):
# a code fence or a heading reads as one while the answer streams, not only once it ends
RENDER_MS = 400
SHOWN_TOKENS = 400  # about how much of a conversation is drawn when it opens (and per "earlier" page)
EARLIER = "earlier"  # the anchor of the "Show earlier messages" link
PLACEHOLDER = "Ask anything. Hover a token to see where it came from."  # one line: Qt draws no more


class ChatView(QTextBrowser):
    action_requested = Signal(str, int)  # an actions.* name, the item's index

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setPlaceholderText(PLACEHOLDER)
        self.document().setDocumentMargin(14)
        self.show_ghosts = False  # rejected drafts are shown on request (View menu, legend)
        self.records: list[TokenRecord] = []  # anchor index -> token
        self._items: list[Turn | Comparison] = []  # what is shown, for re-rendering
        self._frames: list[QTextFrame | None] = []  # each item's bubble (None: not drawn, before _first)
        self._first = 0  # the first item drawn: earlier ones wait behind the "Show earlier messages" link
        self._rows: dict[int, tuple] = {}  # item index -> the action links shown under it
        self._transient: set[int] = set()  # items that are not part of the conversation
        # answers show as rendered Markdown, still coloured by token (as tokens while rejected drafts are
        # drawn: those need the raw text); the answers here were switched to the other way by the user
        self._switched: set[int] = set()
        self._live: list[TokenRecord] | None = None  # the answer being streamed
        self._live_note = ""
        self._live_first = 0
        self._stream: QTextCursor | None = None
        self._render_due = 0.0  # when the live answer may be rendered as Markdown again (time.monotonic)
        self._raw_tail = False  # tokens written as they came since the live answer was last rendered
        self._reading_at: int | None = None  # where the live bubble's "Reading the prompt…" line starts, while shown
        # streamed tokens are written a few times a second, not at every step: each write lays the
        # document out again, and on a small machine the engine process pays for the window's CPU time
        self._unwritten: list[TokenRecord] = []
        self._flush_timer = QTimer(self)
        self._flush_timer.setSingleShot(True)
        self._flush_timer.setInterval(FLUSH_MS)
        self._flush_timer.timeout.connect(self.flush)
        self._colours = self._pick_colours()
        self.anchorClicked.connect(self._on_anchor)

    # -- public -------------------------------------------------------------------------------------
    @property
    def colours(self) -> OriginColours:
        return self._colours

    def item(self, index: int) -> Turn | Comparison | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def show_turns(self, turns) -> None:
        """Replace the transcript with a conversation's turns."""
        self.setPlaceholderText(PLACEHOLDER)
        self._items = list(turns)
        self._first = _page_start(self._items, len(self._items))
        self._transient, self._switched = set(), set()
        self._live = None
        self._rerender()

    def show_opening(self) -> None:
        """An empty transcript that says the conversation is being read."""
        self.show_turns(())
        self.setPlaceholderText("Opening this conversation…")

    def show_earlier(self) -> None:
        """Draw another page of the turns before the first one drawn."""
        if self._first > 0:
            self._first = _page_start(self._items, self._first)
            self._rerender(keep_scroll=True)

    def add_turn(self, turn: Turn, transient: bool = False) -> None:
        """Append a turn; a transient one (e.g. a model that failed to load) gets no actions."""
        self._append(turn, transient)

    def add_card(self, card: Comparison) -> int:
        """Append a comparison card (view-only); returns its index for `update_card`."""
        return self._append(card, transient=True)

    def update_card(self, index: int, card: Comparison) -> None:
        if not isinstance(self.item(index), Comparison) or index >= len(self._frames) or self._frames[index] is None:
            return  # the transcript was replaced meanwhile
        self._items[index] = card
        frame = self._frames[index]
        cursor = frame.firstCursorPosition()
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        with self._keep_bottom():
            self._write_card(cursor, card)

    def begin_answer(self, note: str = "") -> None:
        self._live, self._live_note = [], note
        self._render_due, self._raw_tail = 0.0, False
        self._live_first = len(self.records)  # where the streamed answer's tokens start
        self._stream = self._painter().open_bubble("Assistant", self._colours.assistant_bubble)
        if note:
            self._painter().write_note(self._stream, note)
        self._scroll_to_bottom()  # a new answer is shown wherever the user was (see _append)

    def show_reading(self, text: str) -> None:
        """How far the prompt's reading is, in the answer's bubble until its first token (an empty box before);
        "" takes it away."""
        if self._stream is None:
            return
        with self._keep_bottom():
            if self._reading_at is not None:  # the line shown so far goes
                self._stream.setPosition(self._reading_at, QTextCursor.MoveMode.KeepAnchor)
                self._stream.removeSelectedText()
                self._reading_at = None
            if text:
                self._reading_at = self._stream.position()
                self._stream.insertText(text, self._painter().note_format())

    def append_tokens(self, records: list[TokenRecord]) -> None:
        if self._live is None:
            self.begin_answer()
        if self._reading_at is not None:
            self.show_reading("")
        self._live.extend(records)
        self._unwritten.extend(records)
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    def flush(self) -> None:
        """Write the streamed tokens that wait (the timer does it a few times a second); an answer shown as
        Markdown is rendered again where RENDER_MS has passed, its tokens written as they came in between."""
        records, self._unwritten = self._unwritten, []
        if self._stream is None or not (records or self._raw_tail):
            return
        with self._keep_bottom():
            if self.show_ghosts:  # the raw tokens are what is shown
                self._write_tokens(self._stream, records)
            elif time.monotonic() >= self._render_due:
                self._render_live()
            else:
                self._write_tokens(self._stream, records)
                self._raw_tail = True
                self._flush_timer.start()  # rendered at a later turn, even if no token follows

    def _render_live(self) -> None:
        """The live answer so far rendered as Markdown in its bubble, as a finished one is."""
        frame = self._stream.currentFrame()
        cursor = frame.firstCursorPosition()
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        del self.records[self._live_first :]  # written again, with the same anchors
        paint = self._painter()
        paint.write_header(cursor, "Assistant")
        if self._live_note:
            paint.write_note(cursor, self._live_note)
        text = "".join(rec.text for rec in self._live if rec.origin != "rejected")
        self._write_markdown(cursor, Turn("assistant", text, tuple(self._live)))
        self._stream = cursor
        self._raw_tail = False
        self._render_due = time.monotonic() + RENDER_MS / 1000

    def end_answer(self, turn: Turn) -> None:
        """The streamed answer is complete: add its summary line and actions and keep it as a turn."""
        self.flush()
        if self._reading_at is not None:
            self.show_reading("")
        stream, self._stream, self._live = self._stream, None, None
        if stream is None:
            self.add_turn(turn)
            return
        frame = stream.currentFrame()
        index = self._push(turn, frame, transient=False)
        with self._keep_bottom():
            if self.is_markdown(index):  # streamed as tokens, kept as rendered Markdown
                cursor = frame.firstCursorPosition()
                cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
                cursor.removeSelectedText()
                del self.records[self._live_first :]  # written again, with the same anchors
                self._painter().write_header(cursor, "Assistant")
                self._write_answer(cursor, turn, index)
            elif turn.summary:
                self._painter().write_summary(stream, turn.summary)
            self._refresh_row(index)

    def set_show_ghosts(self, show: bool) -> None:
        if show != self.show_ghosts:
            self.show_ghosts = show
            self._switched = set()  # every answer takes the new default
            self._rerender()

    def is_markdown(self, index: int) -> bool:
        """Whether an answer shows as rendered Markdown (the default unless rejected drafts are drawn)."""
        item = self.item(index)
        if not isinstance(item, Turn) or item.role != "assistant":
            return False
        return (not self.show_ghosts) != (index in self._switched)

    def toggle_markdown(self, index: int) -> None:
        """Switch a finished answer between coloured tokens and rendered Markdown."""
        turn = self.item(index)
        if not isinstance(turn, Turn) or turn.role != "assistant":
            return
        self._switched ^= {index}
        self._rerender(keep_scroll=True)

    def token_at(self, pos: QPoint) -> TokenRecord | None:
        """The token under a viewport position, if any."""
        return self.token_at_href(self.anchorAt(pos))

    def token_at_href(self, href: str) -> TokenRecord | None:
        if href.startswith("t") and href[1:].isdigit() and int(href[1:]) < len(self.records):
            return self.records[int(href[1:])]
        return None

    def item_at(self, pos: QPoint) -> int | None:
        """The index of the item whose bubble holds a viewport position."""
        position = self.cursorForPosition(pos).position()
        for index, frame in enumerate(self._frames):
            if frame is not None and frame.firstPosition() <= position <= frame.lastPosition():
                return index
        return None

    def actions_of(self, index: int) -> tuple[tuple[str, str], ...]:
        """The (name, label) actions that apply to an item now."""
        item = self.item(index)
        if not isinstance(item, Turn) or index in self._transient:
            return ()
        return actions.actions_for(item.role, index == self._last_turn(), self.is_markdown(index),
                                   (item.version, len(item.versions) + 1))

    # -- Qt -----------------------------------------------------------------------------------------
    def viewportEvent(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            href = self.anchorAt(event.pos())
            rec, action = self.token_at_href(href), actions.parse(href)
            if rec is not None:
                QToolTip.showText(event.globalPos(), tooltip(rec), self.viewport())
            elif action is not None:
                QToolTip.showText(event.globalPos(), actions.TIPS[action[0]], self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            colours = self._pick_colours()
            if colours != self._colours:
                self._colours = colours
                self._rerender()

    def contextMenuEvent(self, event) -> None:
        menu = self.createStandardContextMenu(event.pos())
        index = self.item_at(event.pos())
        links = self.actions_of(index) if index is not None else ()
        if links:
            menu.addSeparator()
        for name, label in links:
            if name is None:
                continue
            action = menu.addAction(actions.menu_label(label))
            action.setToolTip(actions.TIPS[name])
            action.triggered.connect(lambda _=False, n=name, i=index: self.action_requested.emit(n, i))
        menu.exec(event.globalPos())
        menu.deleteLater()

    def _on_anchor(self, url: QUrl) -> None:
        if url.toString() == EARLIER:
            self.show_earlier()
            return
        action = actions.parse(url.toString())
        if action is not None and action[1] < len(self._items):
            self.action_requested.emit(*action)

    # -- rendering ----------------------------------------------------------------------------------
    def _pick_colours(self) -> OriginColours:
        return palette_for(self._is_dark())

    def _painter(self) -> BubblePainter:
        return BubblePainter(self.document(), self._colours, self.font(), self._is_dark())

    def _append(self, item, transient: bool) -> int:
        """Draw a new item at the end and scroll to it, wherever the user was: a message sent, an error or a notice
        is what they wait for (after "Show earlier messages" it was off screen, below the page read back)."""
        previous = self._last_turn()
        index = len(self._items)
        self._items.append(item)
        if transient:
            self._transient.add(index)
        self._render_item(index)
        if previous is not None:
            self._refresh_row(previous)  # e.g. the last answer's Regenerate moves on
        self._scroll_to_bottom()
        return index

    def _push(self, item, frame: QTextFrame, transient: bool) -> int:
        previous = self._last_turn()
        index = len(self._items)
        self._items.append(item)
        self._frames.append(frame)
        if transient:
            self._transient.add(index)
        if previous is not None:
            self._refresh_row(previous)
        return index

    def _last_turn(self) -> int | None:
        return next((i for i in range(len(self._items) - 1, -1, -1)
                     if isinstance(self._items[i], Turn) and i not in self._transient), None)

    def _rerender(self, keep_scroll: bool = False) -> None:
        scroll = self.verticalScrollBar().value()
        self.document().clear()
        self.records, self._frames, self._rows, self._stream = [], [None] * self._first, {}, None
        self._reading_at = None
        if self._first:
            cursor = QTextCursor(self.document())
            cursor.insertHtml(f"<p align='center'><a href='{EARLIER}'>Show earlier messages</a> "
                              f"<span style='color:{self._colours.muted}'>({self._first} more)</span></p>")
        for index in range(self._first, len(self._items)):
            self._render_item(index)
        if self._live is not None:
            self._stream = self._painter().open_bubble("Assistant", self._colours.assistant_bubble)
            if self._live_note:
                self._painter().write_note(self._stream, self._live_note)
            self._live_first = len(self.records)
            self._write_tokens(self._stream, self._live)
        self._unwritten = []
        if keep_scroll:
            self.verticalScrollBar().setValue(scroll)
        else:
            self._scroll_to_bottom()

    def _render_item(self, index: int) -> None:
        item, c, paint = self._items[index], self._colours, self._painter()
        if isinstance(item, Comparison):
            cursor = paint.open_bubble(card_title(item), c.assistant_bubble, accent=c.bonus, header=False)
            self._frames.append(cursor.currentFrame())
            self._write_card(cursor, item)
            return
        if item.role == "user":
            cursor = paint.open_bubble("You", c.user_bubble, indent_left=True)
            insert_with_code(cursor, shown(item.content), self._is_dark())
        elif item.role == "error":
            cursor = paint.open_bubble("Error", c.error_bubble)
            paint.write_plain(cursor, shown(item.content), c.error_text)
        else:
            cursor = paint.open_bubble("Assistant", c.assistant_bubble)
            self._write_answer(cursor, item, index)
        self._frames.append(cursor.currentFrame())
        self._refresh_row(index)

    def _write_answer(self, cursor: QTextCursor, turn: Turn, index: int) -> None:
        paint = self._painter()
        if turn.note:
            paint.write_note(cursor, turn.note)
        if self.is_markdown(index):
            self._write_markdown(cursor, turn)
        elif turn.tokens:
            self._write_tokens(cursor, list(turn.tokens))
        else:
            paint.write_plain(cursor, shown(turn.content))
        if turn.summary:
            paint.write_summary(cursor, turn.summary)

    def _write_markdown(self, cursor: QTextCursor, turn: Turn) -> None:
        """The answer rendered, each character in the colour of its token (hover still names the token)."""
        paint = self._painter()
        kept = [rec for rec in turn.tokens if rec.origin != "rejected" and rec.text]
        joined = "".join(rec.text for rec in kept)
        if not kept or joined.strip() != turn.content.strip():  # no tokens, or they do not add up
            insert_markdown(cursor, shown(turn.content), self._is_dark())
            return
        pieces = []
        for rec in kept:
            pieces.append((shown(rec.text), paint.token_format(rec, len(self.records))))
            self.records.append(rec)
        insert_coloured_markdown(cursor, shown(joined), self._is_dark(), pieces)

    def _write_card(self, cursor: QTextCursor, card: Comparison) -> None:
        paint = self._painter()
        paint.write_header(cursor, card_title(card))
        cursor.insertHtml(card_html(card, self._colours))

    def _refresh_row(self, index: int) -> None:
        """Show the actions that apply to an item now, rewriting its row in place when they changed."""
        if index >= len(self._frames) or self._frames[index] is None:
            return
        links = self.actions_of(index)
        if links == self._rows.get(index, ()):
            return
        self._painter().replace_row(self._frames[index], links, index, had_row=index in self._rows)
        if links:
            self._rows[index] = links
        else:
            self._rows.pop(index, None)

    def _write_tokens(self, cursor: QTextCursor, records: list[TokenRecord]) -> None:
        paint = self._painter()
        cursor.beginEditBlock()  # one layout pass for the batch, not one a token
        try:
            self._insert_tokens(cursor, paint, records)
        finally:
            cursor.endEditBlock()

    def _insert_tokens(self, cursor: QTextCursor, paint, records: list[TokenRecord]) -> None:
        for rec in records:
            if not rec.text or (rec.origin == "rejected" and not self.show_ghosts):
                continue  # one record a shown token, as a rendered answer keeps them
            index = len(self.records)
            self.records.append(rec)
            text = shown(rec.text if rec.origin != "rejected" else ghost_text(rec.text))
            cursor.insertText(text, paint.token_format(rec, index))

    def _is_dark(self) -> bool:
        return is_dark(self)

    # -- scrolling ----------------------------------------------------------------------------------
    def _keep_bottom(self):
        """For what grows an item already there (a streamed answer's tokens): reading back stays put."""
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


def ghost_text(text: str) -> str:
    """A rejected draft token as drawn: a line break it proposed is a visible mark, not a new line (it was
    never part of the answer, so it must not move the text after it)."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "↵")


def _page_start(items: list, end: int) -> int:
    """Where a page that ends before `end` starts: about SHOWN_TOKENS tokens of turns, at least two; and the
    beginning where what would be left before it is less than another such page (a two-exchange chat said "Show
    earlier messages (2 more)" over its first question)."""
    start, cost = end, 0
    while start > 0 and (cost < SHOWN_TOKENS or end - start < 2):
        cost += _cost(items[start - 1])
        start -= 1
    return start if any(total >= SHOWN_TOKENS for total in accumulate(map(_cost, items[:start]))) else 0


def _cost(item) -> int:
    """About what drawing an item costs, in tokens."""
    return 20 + (len(item.tokens) if isinstance(item, Turn) and item.tokens else
                 len(item.content) // 4 if isinstance(item, Turn) else 50)
