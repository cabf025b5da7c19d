"""The training dialog as a user meets it: start, progress, the new strategy in the toolbar, use it;
and a cancelled run that says so. The training itself is scripted here (tests/engine covers it)."""

import time

from PySide6.QtCore import Qt

from tests.app.conftest import wait_reply


def scripted_training(target, options, say, should_stop, drafter=None):
    """Stands in for heads.train.run_training: reports progress, then saves an untrained medusa head."""
    from specula.engine.api.errors import TrainingCancelled
    from specula.engine.heads.config import HeadConfig
    from specula.engine.heads.medusa import MedusaHead
    from specula.engine.heads.store import save_head
    from specula.engine.heads.train import TrainResult, head_info

    for i in range(200):
        if should_stop():
            raise TrainingCancelled("training cancelled: the answers made so far are kept, and the next run continues from them")
        say(f"answers: {i * 10}/{options.tokens} tokens")
        time.sleep(0.01 if options.tokens < 50_000 else 0.05)
    head = MedusaHead(HeadConfig.for_target(target.model.config))
    save_head(head, head_info(target, options.kind, 2000, options.epochs, 1.5), options.out)
    return TrainResult(options.kind, options.out, options.out / "training", 2000, options.epochs, 1.5, "chain", 2.0)


def test_training_a_head_adds_its_strategy_and_the_user_can_switch_to_it(make_window, qtbot, monkeypatch, tmp_path):
    monkeypatch.setattr("specula.engine.heads.train.run_training", scripted_training)
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "data"))  # its head is not found by the tests after it
    w = make_window()
    assert "medusa" not in w.loaded.strategies
    w.train_action.trigger()
    dialog = w.train_dialog
    assert dialog.isVisible() and dialog.isModal()
    dialog.kind.setCurrentIndex(dialog.kind.findData("medusa"))
    dialog.tokens.setValue(20_000)
    qtbot.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.status.text().startswith("Answers:"), timeout=30_000)
    assert dialog.cancel_button.isVisible() and not dialog.start_button.isEnabled()
    qtbot.waitUntil(lambda: dialog.use_button.isVisible(), timeout=60_000)
    assert "1.50" in dialog.status.text() and "medusa" in w.loaded.strategies
    qtbot.mouseClick(dialog.use_button, Qt.MouseButton.LeftButton)
    assert not dialog.isVisible()
    assert w.settings.strategy == "medusa" and w.controls.strategy.currentData() == "medusa"
    assert w.send_text("hello")
    ok, finished = wait_reply(qtbot, w)
    assert ok and finished.totals.new_tokens > 0


def test_cancelling_a_training_run_says_so_and_keeps_the_app_usable(make_window, qtbot, monkeypatch, tmp_path):
    monkeypatch.setattr("specula.engine.heads.train.run_training", scripted_training)
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "data"))  # its head is not found by the tests after it
    w = make_window()
    w.open_training()
    dialog = w.train_dialog
    dialog.tokens.setValue(100_000)
    qtbot.mouseClick(dialog.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.status.text().startswith("Answers:"), timeout=30_000)
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.start_button.isEnabled(), timeout=30_000)
    assert "cancelled" in dialog.status.text() and not dialog.use_button.isVisible()
    assert not w.notices.isVisible()  # the dialog said it; no second copy in the window
    dialog.close()
    assert w.send_text("hello")
    ok, _ = wait_reply(qtbot, w)
    assert ok
