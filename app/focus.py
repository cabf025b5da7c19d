"""The keyboard after a dialog: when a dialog closes, the window it was opened from takes the keyboard again.

A window manager usually does this; without one (some remote desktops, a bare X server) nothing does, and the
closed dialog stays the active window: the window's shortcuts (Ctrl+N) do nothing and typing goes nowhere.
So whatever opens a dialog hands the keyboard back when it closes, however it closed (OK, Cancel, Esc, its
close button): from a dialog's `finished` signal, or around what a blocking one returned:
`answer = keyboard_back(self, QMessageBox.question(self, ...))`.
"""

from __future__ import annotations

from typing import TypeVar

from PySide6.QtWidgets import QWidget

T = TypeVar("T")


def keyboard_back(to: QWidget, result: T = None) -> T:
    """`to`'s window becomes the active one again (raised), and `to` takes the focus where it is not that window
    itself (a window gets back the widget that had the focus in it); returns `result` unchanged."""
    window = QWidget.window(to)  # not `to.window()`: a dialog may keep its own `window` attribute (the Models view)
    if window.isVisible():
        window.activateWindow()
        window.raise_()
        if to is not window:
            to.setFocus()
    return result
