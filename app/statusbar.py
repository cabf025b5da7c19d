"""The window's status bar: a message too long for the room beside the permanent labels (the model, the device,
the strategy, the state) is cut with an ellipsis and its whole text is the bar's tooltip, instead of being cut off
mid-word with no way to read the rest (an 800 px window cut the load's progress lines)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QStatusBar, QWidget

MARGIN = 16  # the bar's own margins around its message


class FittingStatusBar(QStatusBar):
    def showMessage(self, text: str, timeout: int = 0) -> None:  # noqa: N802 - Qt's name
        room = self.message_room()
        shown = self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, room) if text else text
        self.setToolTip(text if shown != text else "")
        super().showMessage(shown, timeout)

    def message_room(self) -> int:
        """The width the message has: up to the leftmost permanent label shown."""
        labels = [w for w in self.findChildren(QWidget) if w.parentWidget() is self and w.isVisible()]
        right = min((w.geometry().x() for w in labels), default=self.width())
        return max(40, right - MARGIN)
