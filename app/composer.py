"""Where the user writes: a multi-line input (Enter sends, Shift+Enter starts a new line), Send and Stop.

While an earlier message is being edited, a strip above the input says so and offers Cancel. A message too
large for the engine to take is not sent: a line under the input says so and the text stays to be shortened."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QColor, QPalette, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from specula.app.fit import too_long

EDIT_TEXT = "Editing an earlier message: sending replaces it and drops everything after it."


class MessageInput(QPlainTextEdit):
    submit = Signal()

    def keyPressEvent(self, event) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submit.emit()
            return
        super().keyPressEvent(event)


class EditBar(QFrame):
    """The strip shown while an earlier message is being edited."""

    cancelled = Signal()

    def _style(self) -> None:
        """The style sheet names the palette's colour as it is now (a sheet reads palette(...) only once)."""
        self._styling = True
        shade = QApplication.palette().color(QPalette.ColorRole.AlternateBase).name()
        self.setStyleSheet(f"#editBar {{ border-left: 3px solid #0969da; background: {shade}; }}")
        self._styling = False

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and not getattr(self, "_styling", True):
            self._style()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("editBar")
        self._style()
        label = QLabel(EDIT_TEXT)
        label.setWordWrap(True)
        self.cancel = QToolButton()
        self.cancel.setText("Cancel")
        self.cancel.setAutoRaise(True)
        self.cancel.setToolTip("Stop editing; the conversation stays as it is")
        self.cancel.clicked.connect(self.cancelled)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 2, 2, 2)
        layout.addWidget(label, 1)
        layout.addWidget(self.cancel)


class Composer(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    edit_cancelled = Signal()

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
        self.edit_bar = EditBar()
        self.edit_bar.hide()
        self.edit_bar.cancelled.connect(self.cancel_edit)
        self.refusal = QLabel()  # why the message was not sent, until the text changes
        self.refusal.setWordWrap(True)
        refusal_palette = self.refusal.palette()
        refusal_palette.setColor(QPalette.ColorRole.WindowText, QColor("#cf222e"))
        self.refusal.setPalette(refusal_palette)
        self.refusal.hide()
        self.input.textChanged.connect(self.refusal.hide)
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 10)
        layout.setSpacing(4)
        layout.addWidget(self.edit_bar)
        layout.addLayout(row)
        layout.addWidget(self.refusal)
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

    @property
    def editing(self) -> bool:
        return not self.edit_bar.isHidden()

    def begin_edit(self, text: str) -> None:
        """Put an earlier message in the input to be edited and sent again."""
        self.input.setPlainText(text)
        self.input.moveCursor(QTextCursor.MoveOperation.End)
        self.edit_bar.show()
        self.input.setFocus()

    def end_edit(self) -> None:
        self.edit_bar.hide()

    def cancel_edit(self) -> None:
        if self.editing:
            self.edit_bar.hide()
            self.input.clear()
            self.edit_cancelled.emit()

    def _send(self) -> None:
        text = self.input.toPlainText().strip()
        if not self._can_send or not text:
            return
        refused = too_long(text)
        if refused:  # kept in the input, to be shortened
            self.refusal.setText(refused)
            self.refusal.show()
            return
        self.input.clear()
        self.send_requested.emit(text)
