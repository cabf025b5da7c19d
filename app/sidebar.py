"""The conversation list on the left: pick one, start a new one, search all of them, rename (inline),
export or delete (buttons and the right-click menu)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from PySide6.QtCore import QRect, Qt, QTimer, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QVBoxLayout,
    QWidget,
)

from specula.app.visible import shown

ID_ROLE = Qt.ItemDataRole.UserRole
WHEN_ROLE = Qt.ItemDataRole.UserRole + 1  # when the chat last changed, short ("14:05", "Yesterday", "28 Nov")


def when_text(timestamp: float, now: float | None = None) -> str:
    """A chat's last change as a chat list shows it: the time today, then Yesterday, the weekday within a
    week, the day and month this year, and the full date before; "" when unknown (no date a calendar has)."""
    then = _datetime(timestamp)
    if then is None:
        return ""
    today = datetime.fromtimestamp(time.time() if now is None else now).date()
    day = then.date()
    if day == today:
        return then.strftime("%H:%M")
    if day == today - timedelta(days=1):
        return "Yesterday"
    if today - timedelta(days=7) < day < today:
        return then.strftime("%a")
    if day.year == today.year:
        return f"{day.day} {then.strftime('%b')}"
    return f"{day.day} {then.strftime('%b')} {day.year}"


def _datetime(timestamp: float) -> datetime | None:
    """A stored date as local time; None for what is no date (the store reads those as 0, unknown; this is the
    last guard: a date past the year 9999 or before 1970 raised at every start)."""
    if not timestamp:
        return None
    try:
        return datetime.fromtimestamp(timestamp)
    except (OverflowError, ValueError, OSError):
        return None


def _tooltip(conv, snippet: str | None = None) -> str:
    then = _datetime(conv.updated)
    when = then.strftime("%Y-%m-%d %H:%M") if then is not None else "unknown"
    lines = [shown(conv.title), f"Last message: {when}"] + ([shown(snippet)] if snippet else [])
    return "\n".join(lines)


class _WhenDelegate(QStyledItemDelegate):
    """Draws the title elided on the left and the chat's date in a muted colour on the right."""

    def paint(self, painter, option, index) -> None:
        when = index.data(WHEN_ROLE) or ""
        width = option.fontMetrics.horizontalAdvance(when) + 12 if when else 0
        title_option = type(option)(option)
        self.initStyleOption(title_option, index)
        title_option.rect = QRect(option.rect.adjusted(0, 0, -width, 0))
        style = option.widget.style() if option.widget is not None else None
        if style is not None:  # the full row's background (selection, hover), then the title in its part
            background = type(option)(option)
            self.initStyleOption(background, index)
            background.text = ""
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, background, painter, option.widget)
            title_option.backgroundBrush = Qt.BrushStyle.NoBrush
            title_option.state &= ~QStyle.StateFlag.State_Selected & ~QStyle.StateFlag.State_MouseOver
            title_option.palette.setColor(QPalette.ColorRole.Text, _title_colour(option))
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, title_option, painter, option.widget)
        if when:
            painter.save()
            selected = bool(option.state & QStyle.StateFlag.State_Selected)
            colour = option.palette.color(QPalette.ColorRole.HighlightedText if selected else
                                          QPalette.ColorRole.PlaceholderText)
            painter.setPen(colour)
            painter.drawText(option.rect.adjusted(0, 0, -6, 0), Qt.AlignmentFlag.AlignRight |
                             Qt.AlignmentFlag.AlignVCenter, when)
            painter.restore()


def _title_colour(option):
    selected = bool(option.state & QStyle.StateFlag.State_Selected)
    return option.palette.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)


class ConversationList(QWidget):
    new_requested = Signal()
    selected = Signal(str)  # a conversation id
    renamed = Signal(str, str)  # id, new title
    delete_requested = Signal(str)
    export_requested = Signal(str, str)  # id, "md" or "json"
    search_changed = Signal(str)  # the search text, a moment after typing stops ("" shows every chat)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search all chats")
        self.search.setClearButtonEnabled(True)
        self.search.setToolTip("Find the chats whose messages contain all of these words")
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(200)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.search.text().strip()))
        self.search.textChanged.connect(lambda _: self._search_timer.start())
        self.list = QListWidget()
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.list.setUniformItemSizes(True)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setItemDelegate(_WhenDelegate(self.list))
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new conversation (Ctrl+N)")
        self.rename_button = QPushButton("Rename")
        self.rename_button.setToolTip("Rename the selected conversation (F2)")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setToolTip("Delete the selected conversation")
        row = QHBoxLayout()
        row.setSpacing(4)
        row.addWidget(self.rename_button)
        row.addWidget(self.delete_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        layout.addWidget(self.new_button)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addLayout(row)
        self.new_button.clicked.connect(self.new_requested)
        self.rename_button.clicked.connect(self.start_rename)
        self.delete_button.clicked.connect(self._delete)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemChanged.connect(self._item_changed)

    def show_conversations(self, conversations, current_id: str | None, snippets: dict | None = None) -> None:
        """The list; with `snippets` (id -> the matching text), the results of a search."""
        snippets = snippets or {}
        ids = [c.id for c in conversations]
        if ids == [self.list.item(row).data(ID_ROLE) for row in range(self.list.count())]:
            self._retitle(conversations, current_id)  # same list: never rebuild under an open editor
            return
        self.list.blockSignals(True)
        try:
            self.list.clear()
            for conv in conversations:
                item = QListWidgetItem(shown(conv.title))  # a right-to-left override reversed the row
                item.setData(ID_ROLE, conv.id)
                item.setData(WHEN_ROLE, when_text(conv.updated) if conv.updated else "")
                item.setToolTip(_tooltip(conv, snippets.get(conv.id)))
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                self.list.addItem(item)
                if conv.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self.list.blockSignals(False)
        self._update_buttons()

    def _retitle(self, conversations, current_id: str | None) -> None:
        self.list.blockSignals(True)
        try:
            for row, conv in enumerate(conversations):
                item = self.list.item(row)
                when = when_text(conv.updated) if conv.updated else ""
                if item.text() != shown(conv.title) or item.data(WHEN_ROLE) != when:
                    item.setText(shown(conv.title))
                    item.setData(WHEN_ROLE, when)
                    item.setToolTip(_tooltip(conv))
                if conv.id == current_id:
                    self.list.setCurrentItem(item)
        finally:
            self.list.blockSignals(False)
        self._update_buttons()

    def current_id(self) -> str | None:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item is not None else None

    def start_rename(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.list.editItem(item)

    def _menu(self, pos) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        self.list.setCurrentItem(item)
        cid = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", self.start_rename)
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", self._delete)
        menu.popup(self.list.viewport().mapToGlobal(pos))
        self.menu = menu  # kept for tests and until it closes

    def _delete(self) -> None:
        cid = self.current_id()
        if cid is not None:
            self.delete_requested.emit(cid)

    def _current_changed(self, current, previous) -> None:
        self._update_buttons()
        if current is not None:
            self.selected.emit(current.data(ID_ROLE))

    def _item_changed(self, item) -> None:
        title = " ".join(item.text().split())
        if title:
            self.renamed.emit(item.data(ID_ROLE), title)

    def _update_buttons(self) -> None:
        has = self.list.currentItem() is not None
        self.rename_button.setEnabled(has)
        self.delete_button.setEnabled(has)
