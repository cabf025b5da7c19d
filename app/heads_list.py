"""The draft heads the user added (Models view > Add draft head…), each with the model it was added for, and Remove.

A head is tied to its model (`Settings.draft_heads`): it is offered to that model's strategies when that model loads,
and never to another. Removing the loaded model's head loads the model again without it, so that it stops drafting
at once; another model's is just forgotten. The list is hidden while there are none.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QTableWidgetItem, QVBoxLayout, QWidget

from specula.app.theme import mute

COLUMNS = ("Draft head", "For the model", "Strategy")


class AddedHeads(QWidget):
    def __init__(self, view, table) -> None:
        """`view`: the Models view (its window, its status line, the load it waits for); `table(columns)`: a
        read-only list as the view makes them."""
        super().__init__()
        self.view = view
        self.window = view.window
        self.rows: list[tuple[str, str]] = []  # (model source, head folder) by row
        self.table = table(COLUMNS)
        self.table.setMaximumHeight(110)
        self.table.itemSelectionChanged.connect(self._update_button)
        self.remove_button = QPushButton("Remove head")
        self.remove_button.setToolTip("Stop offering this draft head to its model (its folder is left as it is)")
        self.remove_button.clicked.connect(lambda: self.remove_selected())
        title = QLabel("Draft heads added, each for its model")
        mute(title)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(title, 1)
        row.addWidget(self.remove_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.table)
        self.refresh()

    def refresh(self) -> None:
        """The heads as the settings keep them now."""
        self.rows = sorted(self.window.settings.draft_heads.items())
        self.table.setRowCount(len(self.rows))
        for row, (model, head) in enumerate(self.rows):
            cells = ((Path(head).name or head, head), (_model_name(model), model), (_strategy(head), ""))
            for col, (text, tip) in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                self.table.setItem(row, col, item)
        self.setVisible(bool(self.rows))
        self._update_button()

    def selected(self) -> tuple[str, str] | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return self.rows[rows[0].row()] if rows and rows[0].row() < len(self.rows) else None

    def _update_button(self) -> None:
        self.remove_button.setEnabled(self.selected() is not None)

    def remove_selected(self) -> None:
        """Forget the selected head; the loaded model's is left out at once (the model loads again without it)."""
        chosen = self.selected()
        if chosen is None:
            return
        model, head = chosen
        w = self.window
        new = w.settings.with_head("", model)
        loaded = w.loaded is not None and not w.settings.remote and model == w.settings.model_source
        name = Path(head).name or head
        if loaded:
            self.view._loading = f"{_model_name(model)} without the draft head {name}"
        w.apply_settings(new, reload=loaded)
        self.refresh()
        what = _model_name(model)
        self.view.status.setText(f"Removed the draft head {name}: loading {what} again without it…" if loaded
                                 else f"Removed the draft head {name} (it was added for {what}).")


def _model_name(source: str) -> str:
    return source if source == "bundled" else Path(source).name or source


def _strategy(head: str) -> str:
    """The strategy that drafts with the head, as its folder says; "?" where it is gone or unreadable."""
    from specula.engine.remote.hub import head_strategy

    try:
        return head_strategy(Path(head))
    except (ValueError, OSError):
        return "?"
