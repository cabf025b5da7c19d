"""The window's remembered layout: geometry, dock and splitter state, the ghost-text toggle and the theme, in
`window.ini` next to settings.json (QSettings only for the window's layout; settings live in settings.py)."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QSettings

DEFAULT_SIZE = (1280, 800)


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
    window.set_ghosts(q.value("show_rejected_drafts", False, type=bool))
    window.set_theme(str(q.value("theme", "system")))


def save_layout(window) -> None:
    q = _qsettings(window)
    q.setValue("geometry", window.saveGeometry())
    q.setValue("state", window.saveState())
    q.setValue("splitter", window.splitter.saveState())
    q.setValue("show_rejected_drafts", window.view.show_ghosts)
    q.setValue("theme", window.theme)
    q.sync()
