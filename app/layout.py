"""The window's remembered layout: geometry, dock and splitter state, the ghost-text toggle and the theme, in
`window.ini` next to settings.json (QSettings only for the window's layout; settings live in settings.py)."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QRect, QSettings
from PySide6.QtGui import QGuiApplication

DEFAULT_SIZE = (1280, 800)
TITLE_BAR = 40  # room left for the window manager's title bar when the window was never shown


def _qsettings(window) -> QSettings:
    return QSettings(str(window.settings_store.path.parent / "window.ini"), QSettings.Format.IniFormat)


def restore_layout(window) -> None:
    q = _qsettings(window)
    window.resize(*DEFAULT_SIZE)
    for key, restore in (("geometry", window.restoreGeometry), ("state", window.restoreState),
                         ("splitter", window.splitter.restoreState)):
        value = q.value(key)
        if isinstance(value, QByteArray):
            restore(value)
    fit_to_screen(window)
    window.set_ghosts(q.value("show_rejected_drafts", False, type=bool))
    window.set_theme(str(q.value("theme", "system")))


def fitted(frame: QRect, area: QRect, title_bar: int = 0) -> QRect:
    """`frame` made to fit inside `area` (a screen's available geometry): no larger than it (less a title
    bar's height), and moved onto it where it hangs over an edge."""
    width = min(frame.width(), area.width())
    height = min(frame.height(), area.height() - title_bar)
    x = min(max(frame.x(), area.x()), area.x() + area.width() - width)
    y = min(max(frame.y(), area.y() + title_bar), area.y() + area.height() - height)
    return QRect(x, y, width, height)


def fit_to_screen(window) -> None:
    """Open within the screen's available area (a 1024x700 laptop, an 800x600 projector): the default size
    or a geometry saved on a larger screen is cut to fit and moved onto the screen."""
    screen = window.screen() or QGuiApplication.primaryScreen()
    if screen is None:
        return
    area = screen.availableGeometry()
    before = window.geometry()  # the contents, without the frame
    title = before.y() - window.frameGeometry().y() if window.isVisible() else TITLE_BAR
    after = fitted(before, area, title)
    if after != before:
        window.resize(after.size())
        window.move(after.x(), after.y() - title)  # a window's position is its frame's


def save_layout(window) -> None:
    q = _qsettings(window)
    q.setValue("geometry", window.saveGeometry())
    q.setValue("state", window.saveState())
    q.setValue("splitter", window.splitter.saveState())
    q.setValue("show_rejected_drafts", window.view.show_ghosts)
    q.setValue("theme", window.theme)
    q.sync()
