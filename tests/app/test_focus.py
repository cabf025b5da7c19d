"""The keyboard after every dialog and view: however it closes (OK, Cancel, Esc, its close button), the window
it was opened from has the keyboard again: the chat window's message box, so that Ctrl+N makes a new chat at
once and the next question is typed into it. Offscreen Qt has no window manager to hand the keyboard back,
as some remote desktops have none: a dialog that did not hand it back stays the active window."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QPushButton

from specula.app.history import Turn


def active(widget) -> bool:
    return QApplication.activeWindow() is widget


def press(key, widget=None) -> None:
    """A key as the user presses it: to the widget with the focus."""
    from pytestqt.qtbot import QtBot

    QtBot.keyClick(widget or QApplication.focusWidget() or QApplication.activeWindow(), key)


def when_a_dialog_asks(act):
    """`act(dialog)` once the next blocking dialog (exec(), QMessageBox's and QFileDialog's functions) is shown and
    has the keyboard: the test cannot press a key while it blocks, so a timer looks from inside its event loop.
    Returns the dialog's title and class (a function's dialog is deleted once it returns); one that never has
    the keyboard, or whose `act` failed, is closed and the test fails."""
    seen = {}
    timer = QTimer()
    timer.setInterval(10)

    def look() -> None:
        dialog = QApplication.activeModalWidget()
        seen["looks"] = seen.get("looks", 0) + 1
        if dialog is not None and active(dialog):
            timer.stop()
            seen["title"], seen["kind"] = dialog.windowTitle(), type(dialog).__name__
            try:
                act(dialog)
            except BaseException:
                if dialog.isVisible():
                    dialog.reject()  # not left blocking the run
                raise
        elif seen["looks"] > 3000 and dialog is not None:  # never activated: fail rather than block the run
            timer.stop()
            dialog.reject()

    timer.timeout.connect(look)
    timer.start()
    seen["timer"] = timer  # alive until the dialog is answered
    return seen


def escape(dialog) -> None:
    press(Qt.Key.Key_Escape)


def shown_with_a_chat(make_window, qtbot):
    """A window with the keyboard in its message box and a chat that is not empty (Ctrl+N does not reuse it)."""
    w = make_window()
    w.chat.conversations[w.chat.current_id] = w.chat.current.with_turn(Turn("user", "hi"))
    w.activateWindow()
    w.composer.input.setFocus()
    qtbot.waitUntil(lambda: active(w) and w.composer.input.hasFocus(), timeout=10_000)
    return w


def assert_the_chat_has_the_keyboard(w, qtbot) -> None:
    """The message box has the focus in the active window; Ctrl+N makes a new chat, and typing goes into it."""
    qtbot.waitUntil(lambda: active(w) and w.composer.input.hasFocus(), timeout=10_000)
    before = w.chat.current_id
    qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert w.chat.current_id != before and not w.chat.current.turns
    qtbot.keyClicks(QApplication.focusWidget(), "next")
    assert w.composer.input.toPlainText() == "next"


def click_ok(dialog) -> None:
    from pytestqt.qtbot import QtBot

    QtBot.mouseClick(dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Ok),
                     Qt.MouseButton.LeftButton)


@pytest.mark.parametrize("close", [click_ok, escape, lambda dialog: dialog.close()], ids=["ok", "esc", "close"])
def test_after_settings_the_chat_window_has_the_keyboard(make_window, qtbot, close):
    w = shown_with_a_chat(make_window, qtbot)
    seen = when_a_dialog_asks(close)
    w.settings_action.trigger()
    assert seen["kind"] == "SettingsDialog"
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_the_settings_browse_dialog_the_settings_then_the_chat_have_the_keyboard(make_window, qtbot):
    w = shown_with_a_chat(make_window, qtbot)
    back = {}

    def browse(dialog) -> None:
        asked = when_a_dialog_asks(escape)  # the file dialog: cancelled
        browse = next(b for b in dialog.findChildren(QPushButton) if b.text() == "Browse…")  # the model's
        browse.click()  # blocks until the file dialog is answered
        assert asked["title"] == "Choose a model file"
        qtbot.waitUntil(lambda: active(dialog) and dialog.model.hasFocus(), timeout=10_000)
        back["settings"] = True
        escape(dialog)

    when_a_dialog_asks(browse)
    w.settings_action.trigger()
    assert back["settings"]
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_the_unencrypted_key_question_the_settings_then_the_chat_have_the_keyboard(make_window, qtbot):
    w = shown_with_a_chat(make_window, qtbot)
    back = {}

    def tick(dialog) -> None:
        dialog.backend.setCurrentIndex(dialog.backend.findData("remote"))
        dialog.remote.url.setText("http://example.invalid:8000/v1")
        asked = when_a_dialog_asks(escape)  # No
        dialog.remote.allow_http_key.setFocus()
        press(Qt.Key.Key_Space)  # ticks the box, which asks first: blocks until the question is answered
        assert asked["title"] == "Send the API key unencrypted?"
        qtbot.waitUntil(lambda: active(dialog) and dialog.remote.allow_http_key.hasFocus(), timeout=10_000)
        back["settings"] = not dialog.remote.allow_http_key.isChecked()
        escape(dialog)

    when_a_dialog_asks(tick)
    w.settings_action.trigger()
    assert back["settings"]
    assert_the_chat_has_the_keyboard(w, qtbot)


@pytest.mark.parametrize("close", ["esc", "close"])
def test_after_the_models_view_the_chat_window_has_the_keyboard(make_window, qtbot, close):
    w = shown_with_a_chat(make_window, qtbot)
    w.open_models()
    view = w.models_view
    view.activateWindow()
    qtbot.waitUntil(lambda: active(view), timeout=10_000)
    escape(view) if close == "esc" else view.close()
    assert not view.isVisible()
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_the_add_draft_head_dialog_the_models_view_then_the_chat_have_the_keyboard(make_window, qtbot):
    w = shown_with_a_chat(make_window, qtbot)
    w.open_models()
    view = w.models_view
    view.activateWindow()
    qtbot.waitUntil(lambda: active(view), timeout=10_000)
    asked = when_a_dialog_asks(escape)
    view.head_button.click()  # blocks until the folder dialog is answered
    assert asked["title"] == "A draft head folder"
    qtbot.waitUntil(lambda: active(view), timeout=10_000)
    escape(view)
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_the_remove_question_the_models_view_has_the_keyboard(make_window, qtbot, monkeypatch):
    from specula.engine.remote.hub import ModelEntry

    w = shown_with_a_chat(make_window, qtbot)
    w.open_models()
    view = w.models_view
    view.activateWindow()
    qtbot.waitUntil(lambda: active(view), timeout=10_000)
    entry = ModelEntry("org/m", "org/m", "cache", "/cache/org/m", 1 << 20, "llama", 2048, "", "")
    monkeypatch.setattr(view, "selected", lambda: entry)
    asked = when_a_dialog_asks(escape)  # No: nothing removed
    view.remove_selected()
    assert asked["title"] == "Remove from cache"
    qtbot.waitUntil(lambda: active(view), timeout=10_000)
    escape(view)
    assert_the_chat_has_the_keyboard(w, qtbot)


@pytest.mark.parametrize("close", ["esc", "close button"])
def test_after_the_training_dialog_the_chat_window_has_the_keyboard(make_window, qtbot, close):
    w = shown_with_a_chat(make_window, qtbot)
    w.train_action.trigger()
    dialog = w.train_dialog
    dialog.activateWindow()
    qtbot.waitUntil(lambda: active(dialog), timeout=10_000)
    escape(dialog) if close == "esc" else dialog.close_button.click()
    assert not dialog.isVisible()
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_about_the_chat_window_has_the_keyboard(make_window, qtbot):
    w = shown_with_a_chat(make_window, qtbot)
    about = next(a for a in w.menuBar().actions()[-1].menu().actions() if a.text() == "About Specula")
    seen = when_a_dialog_asks(escape)
    about.trigger()
    assert seen["title"] == "About Specula"
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_the_delete_question_the_chat_window_has_the_keyboard(make_window, qtbot):
    w = shown_with_a_chat(make_window, qtbot)
    kept = w.chat.current_id
    seen = when_a_dialog_asks(escape)  # No
    w.sidebar.delete_requested.emit(kept)
    assert seen["title"] == "Delete conversation" and kept in w.chat.conversations
    assert_the_chat_has_the_keyboard(w, qtbot)


def test_after_the_export_dialog_the_chat_window_has_the_keyboard(make_window, qtbot):
    w = shown_with_a_chat(make_window, qtbot)
    seen = when_a_dialog_asks(escape)  # cancelled: nothing written
    w.sidebar.export_requested.emit(w.chat.current_id, "md")
    assert seen["title"] == "Export conversation"
    assert_the_chat_has_the_keyboard(w, qtbot)
