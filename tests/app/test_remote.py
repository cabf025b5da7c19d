"""The remote backend in the app: the settings dialog's server section, connecting the window to a
scripted server (tests/engine/fake_server.py) through the real Worker thread, streaming, the plots fed
by the server's counters, stop, a server that dies mid-reply, and switching back to the local engine."""

from __future__ import annotations

import socket

import pytest

from specula.app.settings import Settings, SettingsStore
from specula.app.settings_dialog import SettingsDialog, needs_reload
from specula.app.tokens import tooltip
from tests.app.conftest import saved_history, snap, wait_reply
from tests.app.test_streaming import colours_in
from tests.support.fake_server import FakeServer

WORDS = ["Mon", "day", ",", " Tues", "day", ",", " Wednes", "day", ",", " Thurs", "day", ",", " Fri", "day", ",",
         " Satur", "day", " and", " Sun", "day", "."]
STEPS = [WORDS[i:i + 2] for i in range(0, len(WORDS), 2)]  # two tokens a step: one the model's, one a draft
ANSWER = "".join(WORDS)


def dead_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class FakeRing:
    """Stands in for the OS keyring (this machine has none)."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, str], str] = {}

    def get_password(self, service, user):
        return self.stored.get((service, user))

    def set_password(self, service, user, key):
        self.stored[(service, user)] = key

    def delete_password(self, service, user):
        self.stored.pop((service, user), None)


@pytest.fixture()
def ring(monkeypatch):
    import specula.engine.remote.keys as keys

    fake = FakeRing()
    monkeypatch.setattr(keys, "_keyring", lambda: fake)
    return fake


@pytest.fixture()
def no_ring(monkeypatch):
    import specula.engine.remote.keys as keys

    monkeypatch.setattr(keys, "_keyring", lambda: None)


def use_dialog(monkeypatch, fill) -> None:
    """The next Settings dialog is filled by `fill(dialog)` and confirmed with OK, as a user would."""

    def exec_(dialog):
        fill(dialog)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(SettingsDialog, "exec", exec_)


def choose_remote(url: str, **fields):
    def fill(dialog):
        dialog.backend.setCurrentIndex(dialog.backend.findData("remote"))
        dialog.remote.url.setText(url)
        for name, value in fields.items():
            getattr(dialog.remote, name).setText(value)
    return fill


def connect(qtbot, monkeypatch, w, url: str, **fields) -> None:
    """Switch the window to the server at `url` through the Settings dialog and wait until connected."""
    use_dialog(monkeypatch, choose_remote(url, **fields))
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        w.settings_action.trigger()
    # a vLLM-like server: its own speculation, colours inferred, acceptance from its counters
    assert not w.can.strategies and not w.can.exact_colours and not w.can.compare and not w.can.training
    assert w.can.acceptance == "counters" and w.plots.counters


# -- the settings dialog ------------------------------------------------------------------------------
def test_the_dialog_switches_backend_and_enables_the_fields_of_the_chosen_one(qtbot, no_ring):
    from specula.app.settings import Settings

    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    options = dialog.strategies.options
    assert dialog.model.isEnabled() and dialog.device.isEnabled() and options["prompt-lookup", "min_n"].isEnabled()
    assert not dialog.remote.isEnabled() and not dialog.remote.url.isEnabled()
    dialog.backend.setCurrentIndex(dialog.backend.findData("remote"))
    assert not dialog.model.isEnabled() and not dialog.draft.isEnabled() and not dialog.dtype.isEnabled()
    assert not any(field.isEnabled() for field in options.values())  # exit layer, eagle's trees, ...
    assert dialog.remote.url.isEnabled() and dialog.remote.test_button.isEnabled()
    assert dialog.system.isEnabled() and dialog.top_p.isEnabled()  # sampling applies to both backends
    assert "speedup" in dialog.remote.baseline.toolTip()
    dialog.remote.url.setText(" http://127.0.0.1:8011 ")
    dialog.remote.model.setEditText("m")
    dialog.remote.key_env.setText("MY_KEY")
    dialog.remote.verify_tls.setChecked(False)
    new = dialog.result_settings()
    assert (new.backend, new.server_url, new.server_model, new.api_key_env, new.verify_tls) == (
        "remote", "http://127.0.0.1:8011", "m", "MY_KEY", False)
    assert needs_reload(Settings(), new)
    assert not needs_reload(new, new.__class__(**{**new.to_dict(), "model_source": "other"}))  # local-only field
    dialog.adjustSize()
    snap(dialog, "settings-remote")


def test_without_a_keyring_the_key_field_says_to_use_an_environment_variable(qtbot, no_ring):
    from specula.app.settings import Settings

    dialog = SettingsDialog(Settings(backend="remote"))
    qtbot.addWidget(dialog)
    assert dialog.remote.url.isEnabled() and not dialog.remote.key.isEnabled()
    assert "environment variable" in dialog.remote.key.toolTip()


@pytest.mark.parametrize("says_yes", [True, False])
def test_allowing_a_key_over_http_asks_first_naming_the_host(qtbot, monkeypatch, no_ring, says_yes):
    import specula.app.remote_settings as remote_settings
    from specula.app.settings import Settings

    asked = []
    monkeypatch.setattr(remote_settings, "confirm_http_key", lambda parent, host: asked.append(host) or says_yes)
    dialog = SettingsDialog(Settings(backend="remote"))
    qtbot.addWidget(dialog)
    dialog.remote.url.setText("http://10.1.2.3:8000")
    qtbot.mouseClick(dialog.remote.allow_http_key, left())
    assert asked == ["10.1.2.3"]
    assert dialog.remote.allow_http_key.isChecked() is says_yes
    assert dialog.result_settings().allow_http_key is says_yes
    if says_yes:
        qtbot.mouseClick(dialog.remote.allow_http_key, left())  # switching it off again asks nothing
        assert asked == ["10.1.2.3"] and not dialog.remote.allow_http_key.isChecked()


def test_test_connection_shows_the_server_and_fills_the_models(qtbot, no_ring):
    from specula.app.settings import Settings

    dialog = SettingsDialog(Settings(backend="remote"))
    qtbot.addWidget(dialog)
    with FakeServer() as fake:
        dialog.remote.url.setText(fake.url)
        qtbot.mouseClick(dialog.remote.test_button, left())
        assert dialog.remote.result.text() == "Connecting…"  # the answer comes later, from another thread
        assert not dialog.remote.test_button.isEnabled()
        qtbot.waitUntil(lambda: dialog.remote.test_button.isEnabled(), timeout=15_000)
    assert dialog.remote.result.text() == "Connected: vLLM 0.0-fake, 1 model, speculation counters: yes"
    models = [dialog.remote.model.itemText(i) for i in range(dialog.remote.model.count())]
    assert models == ["fake-model"] and dialog.remote.model.currentText() == "fake-model"


def test_test_connection_to_a_dead_port_shows_the_error(qtbot, no_ring):
    from specula.app.settings import Settings

    dialog = SettingsDialog(Settings(backend="remote"))
    qtbot.addWidget(dialog)
    url = dead_url()
    dialog.remote.url.setText(url)
    with qtbot.waitSignal(dialog.remote.tested, timeout=15_000) as blocker:
        qtbot.mouseClick(dialog.remote.test_button, left())
    assert blocker.args == [False]
    text = dialog.remote.result.text()
    assert "Connected" not in text and url.split(":")[-1] in text
    assert dialog.remote.test_button.isEnabled()


def test_the_api_key_goes_to_the_keyring_and_never_to_the_settings_file(make_window, qtbot, monkeypatch, tmp_path,
                                                                         ring):
    w = make_window()
    with FakeServer(api_key="sk-secret-123") as fake:
        connect(qtbot, monkeypatch, w, fake.url, key="sk-secret-123")
        assert ring.stored == {("specula", fake.url): "sk-secret-123"}
        assert w.status_labels["model"].text() == "fake-model"  # the server took the key from the keyring
    text = (tmp_path / "config" / "settings.json").read_text()
    assert "sk-secret" not in text and '"backend": "remote"' in text
    assert "sk-secret" not in repr(w.settings)


def test_an_api_key_from_an_environment_variable(make_window, qtbot, monkeypatch, no_ring):
    monkeypatch.setenv("SPECULA_TEST_KEY", "from-the-environment")
    w = make_window()
    with FakeServer(api_key="from-the-environment") as fake:
        connect(qtbot, monkeypatch, w, fake.url, key_env="SPECULA_TEST_KEY")
        assert w.state == "ready" and w.settings.api_key_env == "SPECULA_TEST_KEY"


def test_a_server_that_cannot_be_reached_leaves_the_local_model_in_use(make_window, qtbot, monkeypatch, no_ring):
    w = make_window(strategy="draft-model")
    use_dialog(monkeypatch, choose_remote(dead_url()))
    with qtbot.waitSignal(w.model_failed, timeout=30_000):
        w.settings_action.trigger()
    text = w.view.toPlainText()
    assert "The server could not be reached" in text and "still in use" in text
    assert w.state == "ready" and w.can.strategies and w.controls.strategy.currentData() == "draft-model"
    assert w.train_action.isEnabled()


# -- the window connected to a server -----------------------------------------------------------------
def test_a_reply_from_a_server_streams_with_inferred_colours_and_server_acceptance(make_window, qtbot, monkeypatch,
                                                                                  tmp_path, no_ring):
    w = make_window(max_new_tokens=64)
    with FakeServer(steps=STEPS, delay_s=0.05) as fake:
        connect(qtbot, monkeypatch, w, fake.url)
        assert [w.controls.strategy.itemText(i) for i in range(w.controls.strategy.count())] == ["server"]
        assert "configured where the server is started" in w.controls.strategy.itemData(0, tooltip_role())
        assert not w.controls.k.isEnabled() and not w.train_action.isEnabled()
        assert w.status_labels["model"].text() == "fake-model" and fake.url in w.status_labels["device"].text()
        assert w.status_labels["strategy"].text() == "strategy: server"
        assert not w.plots.notes.isHidden() and "server-wide" in w.plots.notes.text()
        assert w.send_text("List the days of the week.")
        ok, finished = wait_reply(qtbot, w)
        assert fake.requests[-1]["messages"][-1]["content"] == "List the days of the week."
    assert ok and finished.text == ANSWER
    assert ANSWER in w.view.toPlainText() and "server · " in w.view.toPlainText()
    assert w.view.colours.draft in colours_in(w.view.document())
    records = w.view.records
    assert "".join(r.text for r in records) == ANSWER  # in the stream's order
    assert all(r.inferred for r in records) and {r.origin for r in records} == {"target", "draft"}
    assert "inferred from the server's stream chunks" in tooltip(records[1])
    p = w.plots
    assert len(p.series["acceptance"]) > 0 and len(p.series["rolling"]) == len(p.series["acceptance"])
    assert p.metrics.drafted > 0 and p.stat_labels["acceptance"].text().endswith("%")
    assert sum(p.bars["lengths"].opts["height"]) == len(STEPS) - 1  # one accepted length per decode step
    assert len(p.bars["positions"].opts["height"]) > 0
    assert p.stat_labels["speedup"].text() == "–"  # no baseline server
    assert "server counters" in p.plots["acceptance"].titleLabel.text
    snap(w, "remote-reply")
    # the conversation is saved with the inferred marks
    (saved,), _ = saved_history(tmp_path).load_all()
    assert all(t.inferred for t in saved.turns[-1].tokens)


def test_stop_ends_a_server_reply_as_stopped(make_window, qtbot, monkeypatch, no_ring):
    w = make_window(max_new_tokens=64)
    with FakeServer(steps=STEPS, delay_s=0.05, stall_after=2) as fake:
        connect(qtbot, monkeypatch, w, fake.url)
        w.send_text("List the days of the week.")
        qtbot.waitUntil(lambda: w.chat.reply is not None and len(w.chat.reply.tokens) >= 4, timeout=15_000)
        assert w.composer.stop_button.isEnabled()
        qtbot.mouseClick(w.composer.stop_button, left())
        ok, finished = wait_reply(qtbot, w)
    assert ok and finished.reason == "cancelled"
    assert finished.text == "".join(WORDS[:4])
    assert "stopped" in w.view.toPlainText() and w.state == "ready"


def test_a_server_that_dies_mid_reply_keeps_the_conversation(make_window, qtbot, monkeypatch, no_ring):
    w = make_window(max_new_tokens=64)
    with FakeServer(steps=STEPS, delay_s=0.05, die_after=2) as fake:
        connect(qtbot, monkeypatch, w, fake.url)
        w.send_text("List the days of the week.")
        ok, failed = wait_reply(qtbot, w)
    assert not ok and failed.message and "\n" not in failed.message
    roles = [t.role for t in w.chat.current.turns]
    assert roles == ["user", "assistant", "error"]
    partial = w.chat.current.turns[1].content
    assert partial == "".join(WORDS[:4])
    text = w.view.toPlainText()
    assert "List the days of the week." in text and partial in text and failed.message.rstrip(".") in text
    assert w.state == "ready" and w.composer.input.isEnabled()


def test_switching_back_to_local_restores_the_local_strategy(make_window, qtbot, monkeypatch, tmp_path, no_ring):
    w = make_window(strategy="draft-model")
    with FakeServer(steps=STEPS) as fake:
        connect(qtbot, monkeypatch, w, fake.url)
        assert w.controls.strategy.currentText() == "server"
        w.controls.temperature.setValue(0.5)  # a toolbar change while connected keeps the local strategy
        saved = SettingsStore(tmp_path / "config").load().settings
        assert saved.backend == "remote" and saved.temperature == 0.5
        # the strategy given on the command line is this run's (kept, not saved: the dialog did not change it)
        assert saved.strategy == Settings().strategy and w.settings.strategy == "draft-model"

        def back_to_local(dialog):
            dialog.backend.setCurrentIndex(dialog.backend.findData("local"))

        use_dialog(monkeypatch, back_to_local)
        with qtbot.waitSignal(w.model_ready, timeout=60_000):
            w.settings_action.trigger()
    assert w.can.strategies and w.can.acceptance == "steps" and not w.plots.counters and w.controls.strategy.currentData() == "draft-model"
    assert w.controls.k.isEnabled() and w.train_action.isEnabled() and w.plots.notes.isHidden()
    assert w.status_labels["strategy"].text() == "strategy: draft-model"
    assert SettingsStore(tmp_path / "config").load().settings.backend == "local"
    w.send_text("hello there")
    ok, finished = wait_reply(qtbot, w)
    assert ok and finished.totals.drafted > 0 and not any(r.inferred for r in w.view.records)


@pytest.mark.e2e
def test_a_real_vllm_server_streams_a_reply_and_counts_drafts(make_window, qtbot, monkeypatch, vllm_server, no_ring):
    w = make_window(max_new_tokens=96, temperature=0.0)
    connect(qtbot, monkeypatch, w, vllm_server.url)
    assert w.send_text("List the days of the week twice.")
    ok, finished = wait_reply(qtbot, w, timeout=180_000)
    assert ok and finished.text.strip() and len(w.view.records) > 1
    p = w.plots
    assert p.metrics.drafted > 0 and len(p.series["acceptance"]) > 0
    assert p.stat_labels["acceptance"].text().endswith("%")


def left():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


def tooltip_role():
    from PySide6.QtCore import Qt

    return Qt.ItemDataRole.ToolTipRole
