"""Settings: a versioned file that round-trips, survives corruption and is written atomically."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QLabel

from specula.app.settings import OLD_OPTION_FIELDS, VERSION, Settings, SettingsStore
from specula.app.storage import write_json_atomic
from specula.engine.api.types import SEED_MAX, SEED_MIN
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


@pytest.mark.parametrize("content", ["{not json", "[1, 2, 3]", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1"),
                                     '{"a": ' * 100000 + "1" + "}" * 100000])  # too deep for Python's reader
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


def test_a_file_that_starts_with_a_byte_order_mark_is_read(tmp_path):
    store = SettingsStore(tmp_path)
    store.path.write_text('\ufeff{"version": 10, "top_k": 12}', encoding="utf-8")  # as Notepad writes UTF-8
    loaded = store.load()
    assert loaded.settings.top_k == 12 and loaded.notice is None and store.path.exists()


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


def test_a_seed_out_of_range_is_clamped_with_a_notice_and_the_dialog_holds_the_whole_range(qtbot, tmp_path):
    """A seed past what a generator takes failed every send, and one past 2**31 - 1 made Settings... raise (its
    spin box's top): the file's is brought within the engine's range, which the dialog's field holds."""
    from specula.app.settings_dialog import SettingsDialog

    store = SettingsStore(tmp_path)
    store.path.write_text('{"version": 10, "seed": 123456789012345678901234567890}')
    loaded = store.load()
    assert loaded.settings.seed == SEED_MAX and "seed" in loaded.notice and "out of range" in loaded.notice
    dialog = SettingsDialog(loaded.settings)
    qtbot.addWidget(dialog)
    assert dialog.seed.text() == str(SEED_MAX) and dialog.result_settings().seed == SEED_MAX
    dialog.seed.setText("-" + "9" * 20)
    assert dialog.result_settings().seed == SEED_MIN
    dialog.seed.setText("")
    assert dialog.result_settings().seed is None and dialog.seed.placeholderText() == "random"
    store.path.write_text(f'{{"version": 10, "seed": {SEED_MIN}}}')
    within = store.load()
    assert within.settings.seed == SEED_MIN and within.notice is None


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
    assert loaded.notice is None and s.version == VERSION == 11
    kept = {k: v for k, v in old.items() if k != "version" and k not in OLD_OPTION_FIELDS}
    assert {k: getattr(s, k) for k in kept} == kept
    return store, s


def test_a_version_1_file_still_loads_and_is_saved_as_the_current_version(tmp_path):
    store, s = load_old(tmp_path, V1_FILE)
    assert s.strategy_options == {} and s.request_options() == ()  # every option the engine's default
    store.save(s)
    data = json.loads(store.path.read_text())
    assert data["version"] == VERSION and data["strategy_options"] == {}
    assert data["backend"] == "local" and data["weights"] == "auto"
    assert not set(OLD_OPTION_FIELDS) & set(data)  # the options' fields of versions 2-9 are gone


# each field that versions 2-9 kept a strategy option in: the version that added it, a value that is not its
# default, and the strategy, option and value it is kept as now
OLD_OPTIONS = {
    "lookup_min_n": (2, 2, ("prompt-lookup", "min_n", 2)),
    "lookup_max_n": (2, 5, ("prompt-lookup", "max_n", 5)),
    "exit_layer": (2, 3, ("layer-skip", "exit_layer", 3)),
    "auto_skip": (6, "medusa,lookahead", ("auto", "skip", "medusa,lookahead")),
    "eagle_trees": (8, False, ("eagle", "tree", False)),
    "eagle_lookup": (8, False, ("eagle", "lookup", False)),
    "auto_phrases": (9, False, ("auto", "phrases", False)),
}


@pytest.mark.parametrize("version", range(2, 10))
def test_an_older_files_strategy_options_are_kept_by_the_engines_names(tmp_path, version):
    old = {name: value for name, (since, value, _) in OLD_OPTIONS.items() if since <= version}
    store, s = load_old(tmp_path, {**V1_FILE, "version": version, **old})
    expected: dict = {}
    for name in old:
        strategy, option, value = OLD_OPTIONS[name][2]
        expected.setdefault(strategy, {})[option] = value
    assert s.strategy_options == expected
    assert set(OLD_OPTION_FIELDS) == set(OLD_OPTIONS)  # every old field has its place
    # each strategy's drafter gets what it got before
    sent = {strategy: replace(s, strategy=strategy).request_options() for strategy in expected}
    assert sent["prompt-lookup"] == (("min_n", 2), ("max_n", 5)) and sent["layer-skip"] == (("exit_layer", 3),)
    if version >= 8:
        assert sent["eagle"] == (("tree", False), ("lookup", False))
    if version >= 6:
        assert sent["auto"] == ((("skip", "medusa,lookahead"),) + ((("phrases", False),) if version >= 9 else ()))
    store.save(s)
    assert json.loads(store.path.read_text())["strategy_options"] == expected and store.load().settings == s


def test_old_option_fields_at_their_defaults_become_no_options(tmp_path):
    defaults = {"version": 9, "lookup_min_n": None, "lookup_max_n": None, "exit_layer": None, "auto_skip": "",
                "eagle_trees": True, "eagle_lookup": True, "auto_phrases": True}
    _, s = load_old(tmp_path, defaults)
    assert s.strategy_options == {} and s == Settings()


def test_eagles_trees_and_lookup_branch_are_sent_off_only_when_turned_off_for_eagle(tmp_path):
    assert Settings(strategy="eagle").request_options() == ()  # on: the engine's own default
    off = Settings(strategy="eagle").with_options("eagle", tree=False, lookup=False)
    assert off.request_options() == (("tree", False), ("lookup", False))
    assert replace(off, strategy="medusa").request_options() == ()  # eagle's switches, not medusa's trees
    # auto's switch for the model's own phrases is sent only for auto
    assert off.with_options("auto", phrases=False).request_options() == (("tree", False), ("lookup", False))
    assert Settings(strategy="auto").request_options() == ()
    assert Settings(strategy="auto").with_options("auto", phrases=False).request_options() == (("phrases", False),)
    store = SettingsStore(tmp_path)
    store.save(off)
    assert store.load().settings == off
    store.path.write_text(json.dumps({"version": 8, "eagle_trees": "no", "eagle_lookup": 1}))
    loaded = store.load()
    assert loaded.settings.strategy_options == {}  # reset: both on
    assert "eagle.tree" in loaded.notice and "eagle.lookup" in loaded.notice


def test_weights_setting_reaches_the_load_request_and_is_kept_usable(tmp_path):
    from specula.app.settings import WEIGHTS
    from specula.engine.api.paths import WEIGHT_NAMES

    assert WEIGHTS == WEIGHT_NAMES
    store = SettingsStore(tmp_path)
    store.path.write_text(json.dumps({"version": 3, "dtype": "bf16", "weights": "int3"}))
    assert store.load().settings.weights == "auto"  # an unknown value falls back to the default
    s = Settings(weights="dequantized")
    store.save(s)
    assert store.load().settings == s
    assert s.load_request().target.weights == "dequantized"


def test_a_version_10_draft_head_is_kept_for_the_model_it_was_added_for(tmp_path):
    """Version 10 kept one draft head that every model was loaded with; 11 keeps it with the file's model, so another
    model loads without it, and a value that was no text is reset with the notice."""
    store, s = load_old(tmp_path, {**V1_FILE, "version": 10, "model_source": "/m.gguf", "draft_head": "/h"})
    assert s.draft_heads == {"/m.gguf": "/h"} and s.draft_head == "/h"
    assert replace(s, model_source="bundled").load_request().draft_head is None
    assert replace(s, model_source="bundled").with_head("/b").draft_heads == {"/m.gguf": "/h", "bundled": "/b"}
    assert s.with_head("").draft_heads == {} and s.draft_heads == {"/m.gguf": "/h"}  # never changed in place
    store.save(s)
    data = json.loads(store.path.read_text())
    assert data["draft_heads"] == {"/m.gguf": "/h"} and "draft_head" not in data
    assert load_old(tmp_path, {**V1_FILE, "version": 10, "draft_head": ""})[1].draft_heads == {}
    store.path.write_text(json.dumps({"version": 10, "draft_head": 3}))
    loaded = store.load()
    assert loaded.settings.draft_heads == {} and "draft_heads" in loaded.notice
    store.path.write_text(json.dumps({"version": VERSION, "draft_heads": {"/m": "/h", "/n": 1, " ": "/i"}}))
    loaded = store.load()
    assert loaded.settings.draft_heads == {"/m": "/h"} and "draft_heads./n" in loaded.notice


def test_the_load_request_is_the_engines_own_for_the_chosen_backend():
    from specula.engine.api.types import LoadRequest, ModelChoice, RemoteLoadRequest

    local = Settings(model_source="/m.gguf", draft_source="org/d", draft_heads={"/m.gguf": "/h", "/n.gguf": "/i"},
                     device="cpu", dtype="bf16", weights="native")
    assert local.load_request(prepare="first") == LoadRequest(ModelChoice("/m.gguf", "cpu", "bf16", "native"), "org/d",
                                                              measure_baseline=False, draft_head="/h", prepare="first")
    assert Settings().load_request() == LoadRequest(measure_baseline=False)  # no draft, no head: None
    remote = Settings(backend="remote", server_url="http://h:1", server_model="m", api_key_env="K",
                      baseline_url="http://h:2", verify_tls=False, allow_http_key=True)
    assert remote.load_request(prepare="first") == RemoteLoadRequest("http://h:1", "m", "K", "http://h:2", False,
                                                                     allow_http_key=True)


def test_strategy_options_round_trip_and_are_kept_usable(tmp_path):
    store = SettingsStore(tmp_path)
    s = Settings().with_options("prompt-lookup", min_n=2, max_n=5).with_options("layer-skip", exit_layer=12)
    store.save(s)
    assert store.load().settings == s
    assert replace(s, strategy="prompt-lookup").request_options() == (("min_n", 2), ("max_n", 5))
    assert replace(s, strategy="layer-skip").request_options() == (("exit_layer", 12),)
    assert s.with_options("layer-skip", exit_layer=None).strategy_options == {"prompt-lookup": {"min_n": 2, "max_n": 5}}
    store.path.write_text(json.dumps({"version": 2, "lookup_min_n": 6, "lookup_max_n": 3, "exit_layer": 0}))
    loaded = store.load()
    assert loaded.settings.strategy_options == {"prompt-lookup": {"min_n": 3, "max_n": 6}} and loaded.notice is None
    store.path.write_text(json.dumps({"version": 2, "lookup_min_n": "two", "exit_layer": True}))
    loaded = store.load()
    assert loaded.settings.strategy_options == {}
    assert "prompt-lookup.min_n" in loaded.notice and "layer-skip.exit_layer" in loaded.notice
    # the current version's own: checked against the schema, what it does not know ignored
    options = {"prompt-lookup": {"min_n": 6, "max_n": 3, "unknown": 1}, "layer-skip": {"exit_layer": 0, "min_n": 2},
               "eagle": {"tree": "yes", "lookup": False}, "a-later-strategy": {"x": 1}, "auto": {"skip": ""}}
    store.path.write_text(json.dumps({"version": VERSION, "strategy_options": options}))
    loaded = store.load()
    assert loaded.settings.strategy_options == {"prompt-lookup": {"min_n": 3, "max_n": 6}, "eagle": {"lookup": False}}
    assert loaded.notice == "Some settings were unusable and were reset: eagle.tree"
    for unusable in ([1], {"eagle": "off"}):
        store.path.write_text(json.dumps({"version": VERSION, "strategy_options": unusable}))
        loaded = store.load()
        assert loaded.settings.strategy_options == {} and "strategy_options" in loaded.notice


def test_strategy_options_from_the_dialog_reach_the_engine(make_window, qtbot, monkeypatch, tmp_path, tiny_session):
    from specula.app.settings_dialog import SettingsDialog
    from tests.app.conftest import snap, wait_reply

    w = make_window(strategy="prompt-lookup", max_new_tokens=12)
    loads = []
    w.model_ready.connect(lambda: loads.append(1))

    def edit_and_accept(dialog):
        fields = dialog.strategies.options
        min_n, max_n, exit_layer = fields["prompt-lookup", "min_n"], fields["prompt-lookup", "max_n"], fields[
            "layer-skip", "exit_layer"]
        trees, lookup, phrases = fields["eagle", "tree"], fields["eagle", "lookup"], fields["auto", "phrases"]
        assert min_n.text() == "default" and exit_layer.text() == "default"
        assert trees.isChecked() and lookup.isChecked()
        trees.setChecked(False)
        assert not lookup.isEnabled()  # the branch is the trees' own
        trees.setChecked(True)
        assert lookup.isEnabled()
        lookup.setChecked(False)
        assert phrases.isChecked()
        phrases.setChecked(False)
        min_n.setValue(3)
        max_n.setValue(2)  # below the shortest: the two are swapped
        exit_layer.setValue(1)
        dialog.adjustSize()
        snap(dialog, "settings")
        return True

    monkeypatch.setattr(SettingsDialog, "exec", edit_and_accept)
    w.settings_action.trigger()
    assert w.state == "ready" and not loads  # strategy options need no reload
    saved = SettingsStore(tmp_path / "config").load().settings
    assert saved.strategy_options == {"prompt-lookup": {"min_n": 2, "max_n": 3}, "layer-skip": {"exit_layer": 1},
                                      "eagle": {"lookup": False}, "auto": {"phrases": False}}
    sent = []
    send = w.bridge.send
    w.bridge.send = lambda request: sent.append(request) or send(request)
    w.send_text("hello hello hello")
    ok, _ = wait_reply(qtbot, w)
    assert ok and sent[-1].options == (("min_n", 2), ("max_n", 3))
    lookup = [d for d in tiny_session._drafters.values() if getattr(d, "name", "") == "prompt-lookup"]
    assert lookup and (lookup[-1].min_n, lookup[-1].max_n) == (2, 3)
    # an exit layer the model does not have: the engine's message, in the chat
    w.settings = replace(w.settings, strategy="layer-skip").with_options("layer-skip", exit_layer=9)
    w.send_text("hello")
    ok, failed = wait_reply(qtbot, w)
    assert not ok and "exit layer" in failed.message and "exit layer" in w.view.toPlainText()
    # auto without the model's own phrases: the engine's auto leaves them out
    w.settings = replace(w.settings, strategy="auto")
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


def model_folder(tmp_path) -> str:
    """A folder the engine takes for a model (it holds a config.json); the test's session loads its tiny model."""
    folder = tmp_path / "models" / "other"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return str(folder)


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
    assert "'/no/such/model' is not a file, a folder or a Hub id" in text and "still in use" in text
    assert w.state == "ready" and w.settings.model_source == "bundled" and w.settings.top_p == 0.5
    assert stored()["model_source"] == "bundled" and stored()["top_p"] == 0.5
    other = model_folder(tmp_path)
    choose(other)
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        w.settings_action.trigger()
    assert stored()["model_source"] == other and w.settings.model_source == other
    assert loads == ["bundled", other]  # a source that names no model is refused before the engine reads it


def test_a_saved_model_that_is_gone_falls_back_to_the_bundled_one_for_this_run(make_window, qtbot, tmp_path,
                                                                               tiny_session):
    SettingsStore(tmp_path / "config").save(Settings(model_source="/no/such/model"))
    loads = fail_missing_models(tiny_session)
    w = make_window()  # ready: the bundled model loaded after the saved one failed
    banner = w.notices.label.text()  # a banner, not a turn of the chat that scrolls away
    assert "'/no/such/model' is not a file, a folder or a Hub id" in banner and "bundled model for now" in banner
    assert w.notices.isVisibleTo(w) and "bundled model for now" not in w.view.toPlainText()
    assert loads == ["bundled"] and w.state == "ready"  # the missing one refused before the engine read it
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
        seen["options"] = page.isAncestorOf(page.options["prompt-lookup", "min_n"])
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
    assert w.settings.option("auto", "skip") == "prompt-lookup,lookahead"
    assert dict(w.settings.request_options())["skip"] == "prompt-lookup,lookahead"  # sent with each request
    saved = json.loads((tmp_path / "config" / "settings.json").read_text())
    assert saved["strategy"] == "auto" and saved["strategy_options"]["auto"] == {"skip": "prompt-lookup,lookahead"}


def test_the_strategies_pages_option_fields_are_the_strategy_options_shown_under_each_strategy(qtbot, tmp_path):
    from PySide6.QtWidgets import QCheckBox, QSpinBox

    from specula.app.settings_dialog import SettingsDialog
    from specula.engine.api.strategies import STRATEGIES, STRATEGY_OPTIONS

    old = {name: value for name, (_, value, _) in OLD_OPTIONS.items()}
    _, s = load_old(tmp_path, {"version": 9, **old})  # every option the page shows set to another value
    dialog = SettingsDialog(s)
    qtbot.addWidget(dialog)
    page = dialog.strategies
    shown = [(strategy, option.name) for strategy in STRATEGIES for option in STRATEGY_OPTIONS.values()
             if strategy in option.shown_under]
    assert list(page.options) == shown == [("prompt-lookup", "min_n"), ("prompt-lookup", "max_n"),
                                           ("draft-model", "confident"), ("layer-skip", "exit_layer"),
                                           ("eagle", "tree"), ("eagle", "lookup"), ("auto", "phrases")]
    grid = page.layout().itemAt(1).layout()
    row = {name: grid.getItemPosition(grid.indexOf(button))[0] for name, button in page.buttons.items()}
    ends = dict(zip(STRATEGIES, [*list(row.values())[1:], grid.rowCount()]))
    labels = []
    for (strategy, name), field in page.options.items():
        option = STRATEGY_OPTIONS[name]
        line = field.parentWidget()
        assert row[strategy] < grid.getItemPosition(grid.indexOf(line))[0] < ends[strategy]  # under its strategy
        assert field.toolTip() == option.tip and option.tip
        if option.switch:
            assert isinstance(field, QCheckBox) and not line.findChildren(QLabel)
            labels.append(field.text())
        else:
            low, high = option.bounds
            assert isinstance(field, QSpinBox) and (field.minimum(), field.maximum()) == (low - 1, high)
            assert field.specialValueText() == "default"
            labels += [label.text() for label in line.findChildren(QLabel)]
    assert labels == ["Shortest n-gram", "Longest n-gram", "Draft only confident tokens", "Exit layer", "Token trees",
                      "With prompt lookup's branch", "May draft the model's own phrases"]
    fields = page.options
    assert [fields[key].value() for key in (shown[0], shown[1], shown[3])] == [2, 5, 3]
    assert fields["draft-model", "confident"].isChecked()  # an option no older file had: its default
    assert [fields[key].isChecked() for key in shown[4:]] == [False, False, False]
    assert not fields["eagle", "lookup"].isEnabled()  # greyed while eagle's trees are off
    assert not page.allow["lookahead"].isChecked() and not page.allow["medusa"].isChecked()
    assert dialog.result_settings() == s  # confirmed as it opened: the same settings


@pytest.mark.parametrize("newer", [False, True])
def test_a_saved_strategy_device_or_dtype_this_version_does_not_know_falls_back_and_the_app_starts(
        make_window, qtbot, tmp_path, newer):
    """`"strategy": "warp"` (or a newer version's "hydra") stopped the model loading at every start, and a newer
    version's file was never rewritten: names this version does not know are its defaults for the run, said in one
    notice, and the app starts with its chats and the model. A newer version's file is still left as it wrote it
    (its own strategy and fields kept for it); this version's file takes the defaults at the next save."""
    from specula.app.history import Conversation, Turn
    from tests.app.conftest import saved_history

    saved_history(tmp_path).save(Conversation("kept", "An earlier chat").with_turn(Turn("user", "still here")))
    (tmp_path / "config").mkdir()
    path = tmp_path / "config" / "settings.json"
    written = {"version": VERSION + 1 if newer else VERSION, "strategy": "hydra" if newer else "warp",
               "device": "tpu", "dtype": "fp8", "top_k": 7, "a_future_field": {"x": 1}}
    path.write_text(json.dumps(written))
    w = make_window()
    assert w.state == "ready" and w.loaded is not None
    assert (w.settings.strategy, w.settings.device, w.settings.dtype, w.settings.top_k) == ("auto", "auto", "auto", 7)
    (notice,) = [m for m in w.notices.messages if "does not know" in m]
    assert f"strategy “{written['strategy']}” (auto is used)" in notice and "device “tpu”" in notice
    assert "kept" in w.chat.conversations and w.controls.strategy.currentData() == "auto"
    w.controls.temperature.setValue(0.4)  # a change from the toolbar saves the settings
    stored = json.loads(path.read_text())
    if newer:
        assert stored == written
    else:
        assert (stored["strategy"], stored["device"], stored["dtype"], stored["top_k"]) == ("auto", "auto", "auto", 7)
