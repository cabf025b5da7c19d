"""`specula-chat`: the real app on the bundled model, and the autopilot's exit codes."""

from __future__ import annotations

import pytest
from PySide6.QtGui import QImage

from specula.app.autopilot import Autopilot
from specula.app.main import main, overrides_from, parse_args
from tests.app.conftest import load_without_draft


def distinct_colours(path, step: int = 3) -> int:
    image = QImage(str(path))
    assert not image.isNull()
    return len({image.pixel(x, y) for x in range(0, image.width(), step) for y in range(0, image.height(), step)})


def test_command_line_choices_become_one_run_overrides():
    args = parse_args(["--model", "m.gguf", "--strategy", "none", "--max-new-tokens", "5", "--send", "hi"])
    assert overrides_from(args) == {"model_source": "m.gguf", "strategy": "none", "max_new_tokens": 5}
    assert overrides_from(parse_args([])) == {}
    remote = overrides_from(parse_args(["--server", "http://h:1", "--baseline-server", "http://h:2"]))
    assert remote == {"backend": "remote", "server_url": "http://h:1", "baseline_url": "http://h:2"}
    with pytest.raises(SystemExit):
        parse_args(["--baseline-server", "http://h:2"])


@pytest.mark.parametrize("argv, says", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--max-new-tokens", "abc"], "--max-new-tokens: invalid int value: 'abc'"),
    (["--server", "ftp://127.0.0.1:1"], "--server: server URL must start with http:// or https://"),
    (["--server", "http://h:1", "--baseline-server", "http://h :2"], "--baseline-server: server URL must not contain"),
])
def test_a_bad_argument_exits_2_with_one_line(capsys, argv, says):
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and says in err and "usage:" not in err


def test_without_a_window_to_look_at_a_save_that_fails_is_said_on_stderr_once(make_window, qtbot, tmp_path, capsys):
    from specula.app.history_db import ConversationDB

    w = make_window(strategy="none", max_new_tokens=4)
    (tmp_path / "gone").mkdir()
    w.chat.store = ConversationDB(tmp_path / "gone")  # a folder where the database file belongs
    exits = []
    pilot = Autopilot(w, "hello", None, exit_after=True, quit=exits.append)
    w.model_ready.emit()
    qtbot.waitUntil(lambda: pilot.exit_code is not None, timeout=60_000)
    err = capsys.readouterr().err
    assert pilot.exit_code == 1 and exits == [1]
    assert err.count("it is a folder, not a database file") == 1 and "could not be saved" in err


def test_autopilot_sends_saves_a_screenshot_and_exits(make_window, qtbot, tmp_path):
    w = make_window(strategy="draft-model", max_new_tokens=30)
    png = tmp_path / "shot.png"
    exits = []
    pilot = Autopilot(w, "hello there", png, exit_after=True, quit=exits.append)
    w.model_ready.emit()  # the model was ready before the pilot came aboard
    qtbot.waitUntil(lambda: pilot.exit_code is not None, timeout=60_000)
    assert pilot.exit_code == 0 and exits == [0] and png.exists()
    assert distinct_colours(png) > 50


def test_autopilot_refuses_a_strategy_the_model_lacks(make_window, tiny_session):
    load_without_draft(tiny_session)
    w = make_window(strategy="draft-model")
    exits = []
    pilot = Autopilot(w, "hello", None, exit_after=True, quit=exits.append)
    w.model_ready.emit()
    assert pilot.exit_code == 2 and exits == [2] and w.chat.reply is None


def test_a_saved_strategy_the_model_lacks_is_noted_and_the_message_still_sent(make_window, tiny_session, tmp_path,
                                                                            qtbot, capsys):
    """The window takes another strategy for a saved one the model cannot use, and says so: the autopilot goes on
    with it (it exited 2, as it still does for a strategy asked for on the command line)."""
    from specula.app.settings import Settings, SettingsStore

    load_without_draft(tiny_session)
    SettingsStore(tmp_path / "config").save(Settings(strategy="draft-model", max_new_tokens=4))
    w = make_window()
    exits = []
    pilot = Autopilot(w, "hello", None, exit_after=True, quit=exits.append)
    w.model_ready.emit()
    qtbot.waitUntil(lambda: pilot.exit_code is not None, timeout=60_000)
    assert pilot.exit_code == 0 and exits == [0]
    assert "note: the saved strategy 'draft-model' is not available for this model" in capsys.readouterr().err


def test_a_model_that_does_not_load_exits_non_zero(qapp, capsys):
    code = main(["--model", "/no/such/model.gguf", "--send", "hi", "--exit-after-reply"])
    assert code == 1
    assert "could not be loaded" in capsys.readouterr().err


@pytest.mark.e2e
def test_the_app_answers_on_the_bundled_model_where_a_saved_one_does_not_load_and_saves_a_screenshot(
        qapp, tmp_path, monkeypatch, capsys):
    """The real app and its engine process, once (a start costs seconds): a saved model that is gone gives way to
    the bundled one, the message is answered with the strategy asked for, and the window is saved."""
    from specula.app.settings import Settings, SettingsStore

    monkeypatch.setenv("SPECULA_CONFIG_DIR", str(tmp_path / "config"))
    SettingsStore().save(Settings(model_source=str(tmp_path / "gone.gguf"), strategy="none", max_new_tokens=8))
    png = tmp_path / "window.png"
    code = main(["--send", "Hello", "--strategy", "prompt-lookup", "--max-new-tokens", "24",
                 "--screenshot", str(png), "--exit-after-reply"])
    assert code == 0
    err = capsys.readouterr().err
    assert "note: the saved model could not be loaded" in err and "using the bundled model" in err
    assert png.exists() and distinct_colours(png) > 200
    image = QImage(str(png))
    assert image.width() >= 1000 and image.height() >= 600


def test_the_window_opens_within_the_screens_available_area(make_window, qtbot):
    from PySide6.QtCore import QRect

    from specula.app.layout import TITLE_BAR, fitted

    w = make_window()
    area = w.screen().availableGeometry()  # the offscreen screen: 800x800, smaller than the default 1280x800
    assert area.contains(w.frameGeometry()) and w.width() <= area.width()
    for screen in (QRect(0, 0, 1024, 700), QRect(0, 0, 800, 600), QRect(1920, 0, 1366, 728)):  # the last: a second monitor
        for saved in (QRect(0, 0, 1280, 800), QRect(3000, 900, 900, 500), QRect(-500, -300, 700, 500)):
            got = fitted(saved, screen, TITLE_BAR)
            frame = QRect(got.x(), got.y() - TITLE_BAR, got.width(), got.height() + TITLE_BAR)
            assert screen.contains(frame), (saved, screen, got)
            assert got.width() == min(saved.width(), screen.width())  # cut only where it did not fit
    assert fitted(QRect(100, 100, 600, 400), QRect(0, 0, 1024, 700), TITLE_BAR) == QRect(100, 100, 600, 400)
