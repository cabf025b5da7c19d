"""Settings: a versioned file that round-trips, survives corruption and is written atomically."""

from __future__ import annotations

import json

import pytest

from app.settings import VERSION, Settings, SettingsStore
from app.storage import write_json_atomic


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
    from app.bridge import EngineBridge
    from app.history import HistoryStore
    from app.window import MainWindow

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings.json").write_text("{oops")
    w = MainWindow(SettingsStore(tmp_path / "config"), HistoryStore(tmp_path / "history"), EngineBridge())
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
