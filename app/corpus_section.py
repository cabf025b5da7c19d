"""The Settings' word on what Specula keeps of the model's answers to draft from: the `suffix` strategy and auto's
member of it draft from every earlier answer of the model, kept per model in the data folder so that it outlives a
conversation (and a restart). The answers of a deleted chat leave it; Clear starts it again empty (the chats stay)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from specula.app.theme import mute

WHAT = ("<b>Earlier answers.</b> Auto and suffix draft from the model's earlier answers, kept for each model in "
        "{folder} so that they outlive a chat and a restart ({size}). A deleted chat's answers leave them.")


class CorpusSection(QWidget):
    """What is kept and how much, and a Clear button that calls `clear` (ConversationDB.clear_corpus)."""

    def __init__(self, folder: str, size: tuple[int, int], clear: Callable[[], None] | None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._clear = clear
        self.text = QLabel(WHAT.format(folder=folder, size=_size_text(*size)))
        self.text.setWordWrap(True)
        self.button = QPushButton("Clear earlier answers")
        self.button.setToolTip("Draft only from answers given from now on; your chats are kept")
        self.button.setEnabled(clear is not None)
        self.button.clicked.connect(self._on_clear)
        self.done = QLabel("")
        mute(self.done)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.button)
        row.addWidget(self.done, 1)
        column = QVBoxLayout(self)  # the style's margins, as the strategies' page above it has
        column.addWidget(self.text)
        column.addLayout(row)

    def _on_clear(self) -> None:
        try:
            self._clear()
        except Exception as exc:  # noqa: BLE001 - a store that cannot be written says why; the dialog stays
            self.done.setText(f"Not cleared: {exc}")
            return
        self.button.setEnabled(False)
        self.done.setText("Cleared: the next answers draft only from answers given from now on.")


def _size_text(files: int, size: int) -> str:
    if files == 0:
        return "none kept yet"
    models = "1 model" if files == 1 else f"{files} models"
    return f"{models}, {size / 1e6:.1f} MB" if size >= 100_000 else f"{models}, {max(1, round(size / 1000))} kB"
