"""The window's status bar: a message too long for the room beside the permanent labels (the model, the device,
the strategy, the state) is cut with an ellipsis and its whole text is the bar's tooltip, instead of being cut off
mid-word with no way to read the rest (an 800 px window cut the load's progress lines). The cut is made again when
the room changes: the labels often fill in just after the message that announced them ("Loaded ...")."""

from __future__ import annotations

import time

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QStatusBar, QWidget

MARGIN = 16  # the bar's own margins around its message


class FittingStatusBar(QStatusBar):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self._full = ""  # the message as given, while it is shown
        self._until = 0.0  # when it ends (time.monotonic; 0: when another replaces it)
        self.messageChanged.connect(self._changed)

    def showMessage(self, text: str, timeout: int = 0) -> None:  # noqa: N802 - Qt's name
        self._full, self._until = text, time.monotonic() + timeout / 1000 if timeout > 0 else 0.0
        self.setToolTip("")
        self._fit()

    def message_room(self) -> int:
        """The width the message has: up to the leftmost permanent label shown."""
        labels = [w for w in self.findChildren(QWidget)  # not yet laid out (at 0): no measure of the room
                  if w.parentWidget() is self and w.isVisible() and w.x() > 0]
        right = min((w.geometry().x() for w in labels), default=self.width())
        return max(40, right - MARGIN)

    def event(self, event) -> bool:
        handled = super().event(event)
        if event.type() in (QEvent.Type.LayoutRequest, QEvent.Type.Resize) and self._full:
            self._fit()
        return handled

    def _fit(self) -> None:
        """Show the message cut to the room there is now, for what is left of its time."""
        text = self._full
        shown = self.fontMetrics().elidedText(text, Qt.TextElideMode.ElideRight, self.message_room()) if text else text
        if shown != text:
            self.setToolTip(text)  # a tooltip the caller set for a message that fits stays
        if shown == self.currentMessage() and text:
            return
        left = 0 if not self._until else max(1, round((self._until - time.monotonic()) * 1000))
        super().showMessage(shown, left)

    def _changed(self, text: str) -> None:
        if not text and self._full:  # timed out or cleared: nothing to fit any more
            self._full = ""
            self.setToolTip("")
