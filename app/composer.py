"""Where the user writes: a multi-line input (Enter sends, Shift+Enter starts a new line), Send and Stop."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class MessageInput(QPlainTextEdit):
    submit = Signal()

    def keyPressEvent(self, event) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.input = MessageInput()
        self.input.setTabChangesFocus(True)
        self.input.setFixedHeight(self.input.fontMetrics().lineSpacing() * 4 + 16)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.setToolTip("Send (Enter); Shift+Enter starts a new line")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the answer (Esc)")
        self.stop_button.setShortcut("Esc")
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 10)
        layout.addWidget(self.input, 1)
        layout.addLayout(buttons)
        self.input.submit.connect(self._send)
        self.send_button.clicked.connect(self._send)
        self.stop_button.clicked.connect(self.stop_requested)
        self.set_state(ready=False, generating=False)

    def set_state(self, ready: bool, generating: bool, hint: str | None = None) -> None:
        """Typing needs a model; sending needs it idle; stopping needs an answer under way."""
        self._can_send = ready and not generating
        self.input.setEnabled(ready)
        default = "Message the model (Enter sends, Shift+Enter for a new line)" if ready else "Waiting for the model…"
        self.input.setPlaceholderText(hint or default)
        self.send_button.setEnabled(self._can_send)
        self.stop_button.setEnabled(generating)

    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if not self._can_send or not text:
            return
        self.input.clear()
        self.send_requested.emit(text)
