"""The conversation list on the left: pick one, start a new one, search all of them, rename (inline),
export or delete (buttons and the right-click menu)."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (QAbstractItemView, QHBoxLayout, QLineEdit, QListWidget, QListWidgetItem, QMenu,
                               QPushButton, QVBoxLayout, QWidget)

ID_ROLE = Qt.ItemDataRole.UserRole


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
                item = QListWidgetItem(conv.title)
                item.setData(ID_ROLE, conv.id)
                item.setToolTip(f"{conv.title}\n{snippets[conv.id]}" if conv.id in snippets else conv.title)
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
                if item.text() != conv.title:
                    item.setText(conv.title)
                    item.setToolTip(conv.title)
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
