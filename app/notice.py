"""A dismissible banner above the transcript for things the user should know (a settings file that
was reset, a conversation file set aside, a strategy that is not available)."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton


class NoticeBar(QFrame):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.setStyleSheet("#noticeBar { background: #fff4d6; border: 1px solid #e3c26b; border-radius: 4px; }"
                           "#noticeBar QLabel { color: #4d3800; }")
        self.label = QLabel()
        self.label.setWordWrap(True)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.dismiss)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(close)
        self.messages: list[str] = []
        self.hide()

    def add(self, message: str) -> None:
        self.messages.append(message)
        self.label.setText("<br>".join(self.messages))
        self.show()

    def remove(self, message: str) -> None:
        if message in self.messages:
            self.messages.remove(message)
            self.label.setText("<br>".join(self.messages))
            self.setVisible(bool(self.messages))

    def dismiss(self) -> None:
        self.messages = []
        self.hide()
