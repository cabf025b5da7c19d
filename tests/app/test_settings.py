"""Settings: a versioned file that round-trips, survives corruption and is written atomically."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QLabel

from specula.app.settings import VERSION, Settings, SettingsStore
from specula.app.storage import write_json_atomic
from tests.app.conftest import snap


def test_settings_round_trip(tmp_path):
    store = SettingsStore(tmp_path)
    s = Settings(strategy="layer-skip", k=7, adaptive_k=True, temperature=0.7, top_p=0.9, top_k=40, seed=123,
                 max_new_tokens=99, system_prompt="Be brief.", model_source="/models/x.gguf",
                 draft_source="org/draft", device="cpu", dtype="bf16")
    store.save(s)
    loaded = store.load()
    assert loaded.settings == s and loaded.notice is None
    assert json.loads(store.path.read_text())["version"] == VERSION


def test_missing_file_gives_defaults(tmp_path):
    loaded = SettingsStore(tmp_path).load()
    assert loaded.settings == Settings() and loaded.notice is None


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")])
def test_a_corrupt_file_is_moved_aside_and_defaults_are_used(tmp_path, content):
    store = SettingsStore(tmp_path)
    store.path.write_text(content, encoding="latin-1")
    loaded = store.load()
    assert loaded.settings == Settings()
    assert loaded.notice and "moved" in loaded.notice
    aside = list(tmp_path.glob("settings.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text(encoding="latin-1") == content
    assert not store.path.exists()
    store.save(loaded.settings)  # and the defaults can be saved again
    assert store.load().settings == Settings()


def test_bad_fields_fall_back_and_numbers_are_clamped(tmp_path):
    store = SettingsStore(tmp_path)
    store.path.write_text(json.dumps({"version": 99, "k": "four", "temperature": -1, "max_new_tokens": 10**9,
                                      "top_p": 0, "seed": True, "strategy": "none", "unknown": 1}))
    loaded = store.load()
    s = loaded.settings
    assert s.k == Settings().k and s.seed is None and s.strategy == "none"
    assert s.temperature == 0.0 and s.top_p == 1.0 and s.max_new_tokens <= 32768
    assert "k" in loaded.notice and "seed" in loaded.notice


def test_a_number_that_is_no_number_is_reset_with_a_notice(tmp_path):
    """Python's JSON reader takes NaN and Infinity; a clamp keeps NaN (every comparison with it fails), and every
    send would fail while the spin box showed its top."""
    store = SettingsStore(tmp_path)
    store.path.write_text('{"version": 9, "temperature": NaN, "top_p": Infinity, "strategy": "none"}')
    loaded = store.load()
    assert loaded.settings.temperature == Settings().temperature and loaded.settings.top_p == Settings().top_p
    assert loaded.settings.strategy == "none"
    assert "temperature" in loaded.notice and "top_p" in loaded.notice


def test_atomic_write_leaves_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "settings.json"
    write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": object()})  # not serialisable: nothing is written
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["settings.json"]  # no temporary file left behind


def test_atomic_write_replaces_through_a_temporary_file(tmp_path, monkeypatch):
    import os

    path = tmp_path / "settings.json"
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append((os.path.dirname(src), os.fspath(dst), json.loads(open(src).read())))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_json_atomic(path, {"b": 2})
    assert seen == [(str(tmp_path), str(path), {"b": 2})]


def test_the_window_tells_the_user_about_a_corrupt_settings_file(qtbot, tmp_path):
    from specula.app.bridge import EngineBridge
    from specula.app.window import MainWindow
    from tests.app.conftest import saved_history

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings.json").write_text("{oops")
    w = MainWindow(SettingsStore(tmp_path / "config"), saved_history(tmp_path), EngineBridge())
    qtbot.addWidget(w)
    assert w.notices.isVisibleTo(w) and "moved" in w.notices.messages[0]
    assert w.settings == Settings()
    w.close()


def test_toolbar_changes_are_saved_but_command_line_choices_are_not(make_window, tmp_path):
    w = make_window(strategy="none", max_new_tokens=10)
    w.controls.k.setValue(9)
    saved = SettingsStore(tmp_path / "config").load().settings
    assert saved.k == 9
    assert saved.strategy == Settings().strategy and saved.max_new_tokens == Settings().max_new_tokens
    assert w.settings.strategy == "none" and w.settings.k == 9
    # the Settings dialog confirmed with the one-run value left as it was: still not saved
    w.apply_settings(replace(w.settings, top_k=7), reload=False)
    saved = SettingsStore(tmp_path / "config").load().settings
    assert saved.top_k == 7 and saved.max_new_tokens == Settings().max_new_tokens and w.settings.max_new_tokens == 10
    w.apply_settings(replace(w.settings, max_new_tokens=33), reload=False)  # changed by the user: theirs, saved
    assert SettingsStore(tmp_path / "config").load().settings.max_new_tokens == 33


V1_FILE = {"version": 1, "strategy": "layer-skip", "k": 6, "adaptive_k": True, "temperature": 0.3, "top_p": 0.9,
           "top_k": 20, "seed": 5, "max_new_tokens": 128, "system_prompt": "Be kind.", "model_source": "bundled",
           "draft_source": "", "device": "cpu", "dtype": "fp32"}


def load_old(folder, old: dict):
    """Settings read from an older version's file: nothing to report, every old value kept."""
    store = SettingsStore(folder)
    store.path.write_text(json.dumps(old))
    loaded = store.load()
    s = loaded.settings
    assert loaded.notice is None and s.version == VERSION == 9
    assert {k: getattr(s, k) for k in old if k != "version"} == {k: v for k, v in old.items() if k != "version"}
    return store, s


def test_a_version_1_file_still_loads_and_is_saved_as_the_current_version(tmp_path):
    store, s = load_old(tmp_path, V1_FILE)
    assert (s.lookup_min_n, s.lookup_max_n, s.exit_layer) == (None, None, None)
    assert s.strategy_options() == ()
    store.save(s)
    data = json.loads(store.path.read_text())
    assert data["version"] == 9 and data["exit_layer"] is None and "lookup_min_n" in data and data["auto_skip"] == ""
    assert data["backend"] == "local" and data["weights"] == "auto"
    assert data["eagle_trees"] is True and data["eagle_lookup"] is True  # eagle's defaults
    assert data["auto_phrases"] is True


def test_eagles_trees_and_lookup_branch_are_sent_off_only_when_turned_off_for_eagle(tmp_path):
    assert Settings(strategy="eagle").strategy_options() == ()  # on: the engine's own default
    off = Settings(strategy="eagle", eagle_trees=False, eagle_lookup=False)
    assert off.strategy_options() == (("tree", False), ("lookup", False))
    assert replace(off, strategy="medusa").strategy_options() == ()  # eagle's switches, not medusa's trees
    # auto's switch for the model's own phrases is sent only for auto
    assert replace(off, auto_phrases=False).strategy_options() == (("tree", False), ("lookup", False))
    assert Settings(strategy="auto").strategy_options() == ()
    assert Settings(strategy="auto", auto_phrases=False).strategy_options() == (("phrases", False),)
    store = SettingsStore(tmp_path)
    store.save(off)
    assert store.load().settings == off
    store.path.write_text(json.dumps({"version": 8, "eagle_trees": "no"}))
    loaded = store.load()
    assert loaded.settings.eagle_trees is True and "eagle_trees" in loaded.notice


def test_weights_setting_reaches_the_load_request_and_is_kept_usable(tmp_path):
    from specula.app.bridge import ModelChoice
    from specula.app.settings import WEIGHTS
    from specula.engine.api.paths import WEIGHT_NAMES

    assert WEIGHTS == WEIGHT_NAMES
    store = SettingsStore(tmp_path)
    store.path.write_text(json.dumps({"version": 3, "dtype": "bf16", "weights": "int3"}))
    assert store.load().settings.weights == "auto"  # an unknown value falls back to the default
    s = Settings(weights="dequantized")
    store.save(s)
    assert store.load().settings == s
    assert ModelChoice.from_settings(s).request().target.weights == "dequantized"


def test_strategy_options_round_trip_and_are_kept_usable(tmp_path):
    store = SettingsStore(tmp_path)
    s = Settings(lookup_min_n=2, lookup_max_n=5, exit_layer=12)
    store.save(s)
    assert store.load().settings == s
    assert s.strategy_options() == (("min_n", 2), ("max_n", 5), ("exit_layer", 12))
    store.path.write_text(json.dumps({"version": 2, "lookup_min_n": 6, "lookup_max_n": 3, "exit_layer": 0}))
    loaded = store.load().settings
    assert (loaded.lookup_min_n, loaded.lookup_max_n, loaded.exit_layer) == (3, 6, None)
    store.path.write_text(json.dumps({"version": 2, "lookup_min_n": "two"}))
    loaded = store.load()
    assert loaded.settings.lookup_min_n is None and "lookup_min_n" in loaded.notice


def test_strategy_options_from_the_dialog_reach_the_engine(make_window, qtbot, monkeypatch, tmp_path, tiny_session):
    from specula.app.settings_dialog import SettingsDialog
    from tests.app.conftest import snap, wait_reply

    w = make_window(strategy="prompt-lookup", max_new_tokens=12)
    loads = []
    w.model_ready.connect(lambda: loads.append(1))

    def edit_and_accept(dialog):
        assert dialog.min_n.text() == "default" and dialog.exit_layer.text() == "default"
        assert dialog.eagle_trees.isChecked() and dialog.eagle_lookup.isChecked()
        dialog.eagle_trees.setChecked(False)
        assert not dialog.eagle_lookup.isEnabled()  # the branch is the trees' own
        dialog.eagle_trees.setChecked(True)
        assert dialog.eagle_lookup.isEnabled()
        dialog.eagle_lookup.setChecked(False)
        assert dialog.auto_phrases.isChecked()
        dialog.auto_phrases.setChecked(False)
        dialog.min_n.setValue(2)
        dialog.max_n.setValue(3)
        dialog.exit_layer.setValue(1)
        dialog.adjustSize()
        snap(dialog, "settings")
        return True

    monkeypatch.setattr(SettingsDialog, "exec", edit_and_accept)
    w.settings_action.trigger()
    assert w.state == "ready" and not loads  # strategy options need no reload
    saved = SettingsStore(tmp_path / "config").load().settings
    assert (saved.lookup_min_n, saved.lookup_max_n, saved.exit_layer) == (2, 3, 1)
    assert saved.eagle_trees and not saved.eagle_lookup and not saved.auto_phrases
    sent = []
    send = w.bridge.send
    w.bridge.send = lambda request: sent.append(request) or send(request)
    w.send_text("hello hello hello")
    ok, _ = wait_reply(qtbot, w)
    assert ok and sent[-1].options == (("min_n", 2), ("max_n", 3), ("exit_layer", 1))
    lookup = [d for d in tiny_session._drafters.values() if getattr(d, "name", "") == "prompt-lookup"]
    assert lookup and (lookup[-1].min_n, lookup[-1].max_n) == (2, 3)
    # an exit layer the model does not have: the engine's message, in the chat
    w.settings = replace(w.settings, strategy="layer-skip", exit_layer=9)
    w.send_text("hello")
    ok, failed = wait_reply(qtbot, w)
    assert not ok and "exit layer" in failed.message and "exit layer" in w.view.toPlainText()
    # auto without the model's own phrases: the engine's auto leaves them out
    w.settings = replace(w.settings, strategy="auto", exit_layer=None)
    w.send_text("hello hello")
    ok, _ = wait_reply(qtbot, w)
    assert ok and ("phrases", False) in sent[-1].options
    autos = [d for d in tiny_session._drafters.values() if getattr(d, "name", "") == "auto"]
    assert autos and autos[-1].phrases is None


V2_FILE = {**V1_FILE, "version": 2, "lookup_min_n": 2, "lookup_max_n": 4, "exit_layer": None}


def test_a_version_2_file_migrates_to_the_local_backend(tmp_path):
    store, s = load_old(tmp_path, V2_FILE)
    assert (s.backend, s.server_url, s.server_model, s.api_key_env, s.baseline_url, s.verify_tls) == (
        "local", "", "", "", "", True)
    assert not s.remote
    store.save(s)
    data = json.loads(store.path.read_text())
    assert data["version"] == VERSION and data["backend"] == "local" and data["verify_tls"] is True


def test_remote_settings_round_trip_and_an_unknown_backend_is_local(tmp_path):
    store = SettingsStore(tmp_path)
    s = Settings(backend="remote", server_url="http://127.0.0.1:8011", server_model="m", api_key_env="MY_KEY",
                 baseline_url="http://127.0.0.1:8012", verify_tls=False)
    store.save(s)
    assert store.load().settings == s and s.remote
    store.path.write_text(json.dumps({"version": 3, "backend": "cloud", "server_url": "  http://h:1  "}))
    loaded = store.load().settings
    assert loaded.backend == "local" and loaded.server_url == "http://h:1"
    store.path.write_text(json.dumps({"version": 3, "verify_tls": "yes"}))
    loaded = store.load()
    assert loaded.settings.verify_tls is True and "verify_tls" in loaded.notice
    # a key is never a setting: only the name of its variable, and whether it may go over plain http
    assert [f for f in Settings().to_dict() if "key" in f] == ["api_key_env", "allow_http_key"]
    assert isinstance(Settings().allow_http_key, bool)


def test_a_file_from_a_newer_version_is_read_for_what_is_known_and_never_overwritten(tmp_path):
    store = SettingsStore(tmp_path)
    newer = {"version": VERSION + 1, "strategy": "prompt-lookup", "k": 6, "a_future_field": {"x": 1}}
    store.path.write_text(json.dumps(newer))
    loaded = store.load()
    assert loaded.newer and loaded.settings.strategy == "prompt-lookup" and loaded.settings.k == 6
    assert "newer version of Specula" in loaded.notice and str(store.path) in loaded.notice
    store.save(replace(loaded.settings, k=3))
    assert json.loads(store.path.read_text()) == newer  # the newer version's file is left as it was


def test_a_write_killed_half_way_leaves_no_temporary_file_for_long(tmp_path):
    import os
    import time

    store = SettingsStore(tmp_path)
    store.save(Settings(k=3))
    old = tmp_path / ".settings.json.abc123.tmp"  # what a kill during a save leaves
    old.write_text("{half")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    fresh = tmp_path / ".settings.json.def456.tmp"  # another window's save in progress
    fresh.write_text("{")
    assert store.load().settings.k == 3
    assert not old.exists() and fresh.exists()


def fail_missing_models(session) -> list[str]:
    """Make `session` refuse models under /no/such (as a missing folder is); returns the sources it is asked
    to load, in order."""
    from specula.engine.api.errors import SpeculaError

    loads, load = [], session.load

    def load_or_fail(request, progress=None):
        loads.append(request.target.source)
        if request.target.source.startswith("/no/such"):
            raise SpeculaError(f"no model at {request.target.source}")
        return load(request, progress)

    session.load = load_or_fail
    return loads


def test_a_model_change_is_saved_only_once_it_loaded(make_window, qtbot, monkeypatch, tmp_path, tiny_session):
    from specula.app.settings_dialog import SettingsDialog

    loads = fail_missing_models(tiny_session)
    w = make_window()
    stored = lambda: json.loads((tmp_path / "config" / "settings.json").read_text())  # noqa: E731

    def choose(source):
        def exec_(dialog):
            dialog.model.setText(source)
            dialog.top_p.setValue(0.5)  # a setting that needs no reload is saved at once
            dialog.accept()
            return dialog.result()

        monkeypatch.setattr(SettingsDialog, "exec", exec_)

    choose("/no/such/model")
    with qtbot.waitSignal(w.model_failed, timeout=30_000):
        w.settings_action.trigger()
        assert stored()["model_source"] == "bundled"  # while it loads, the file keeps the model that works
    text = w.view.toPlainText()
    assert "no model at /no/such/model" in text and "still in use" in text
    assert w.state == "ready" and w.settings.model_source == "bundled" and w.settings.top_p == 0.5
    assert stored()["model_source"] == "bundled" and stored()["top_p"] == 0.5
    choose("/models/other")
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        w.settings_action.trigger()
    assert stored()["model_source"] == "/models/other" and w.settings.model_source == "/models/other"
    assert loads == ["bundled", "/no/such/model", "/models/other"]


def test_a_saved_model_that_is_gone_falls_back_to_the_bundled_one_for_this_run(make_window, qtbot, tmp_path,
                                                                               tiny_session):
    SettingsStore(tmp_path / "config").save(Settings(model_source="/no/such/model"))
    loads = fail_missing_models(tiny_session)
    w = make_window()  # ready: the bundled model loaded after the saved one failed
    text = w.view.toPlainText()
    assert "no model at /no/such/model" in text and "bundled model for now" in text
    assert loads == ["/no/such/model", "bundled"] and w.state == "ready"
    w.controls.temperature.setValue(0.4)  # a change from the toolbar saves the settings
    saved = json.loads((tmp_path / "config" / "settings.json").read_text())
    assert saved["model_source"] == "/no/such/model"  # the user's choice is kept for when it is back



def test_the_strategies_page_lists_what_the_model_can_use_and_stays_in_step_with_the_toolbar(
        make_window, qtbot, monkeypatch, tmp_path):
    from specula.app.settings_dialog import SettingsDialog

    w = make_window(strategy="prompt-lookup")
    seen = {}

    def exec_(dialog):
        page = dialog.strategies
        seen["enabled"] = {n for n, b in page.buttons.items() if b.isEnabled()}
        seen["checked"] = next(n for n, b in page.buttons.items() if b.isChecked())
        seen["options"] = dialog.min_n.parent() is not None and page.isAncestorOf(dialog.min_n)
        seen["texts"] = " ".join(label.text() for label in page.findChildren(QLabel))
        dialog.tabs.setCurrentIndex(1)
        dialog.resize(640, 600)
        snap(dialog, "settings-strategies")
        page.buttons["auto"].setChecked(True)
        page.allow["lookahead"].setChecked(False)
        page.allow["prompt-lookup"].setChecked(False)
        dialog.accept()
        return dialog.result()

    monkeypatch.setattr(SettingsDialog, "exec", exec_)
    w.settings_action.trigger()
    assert seen["enabled"] == set(w.loaded.strategies) and seen["checked"] == "prompt-lookup"
    assert "needs a trained eagle head" in seen["texts"] and "Train a draft head" in seen["texts"]
    assert seen["options"]  # prompt lookup's options sit under it
    assert w.settings.strategy == "auto" and w.controls.strategy.currentData() == "auto"  # the toolbar follows
    assert w.settings.auto_skip == "prompt-lookup,lookahead"
    assert dict(w.settings.strategy_options())["skip"] == "prompt-lookup,lookahead"  # sent with each request
    saved = json.loads((tmp_path / "config" / "settings.json").read_text())
    assert saved["strategy"] == "auto" and saved["auto_skip"] == "prompt-lookup,lookahead"
