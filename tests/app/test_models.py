"""The Models view: the models on this machine, a download from a local stand-in for the Hub with progress,
cancel and resume, then the model used (and saved as the choice once it loaded), and drafts found by
vocabulary."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QPushButton

from specula.engine.remote.hub import ModelEntry
from tests.app.conftest import snap
from tests.engine.test_hub import GGUF_REPO, REPO, WEIGHTS, fake, repos  # noqa: F401 - fixtures


@pytest.fixture
def hub(fake):  # noqa: F811 - the fixture imported above
    """The local Hub stand-in as HF_ENDPOINT, with an empty Hugging Face cache."""
    return fake


def listed(view, qtbot, after: int = 0):
    """The sources listed once a list newer than the `after`th arrived."""
    qtbot.waitUntil(lambda: view.listings > after, timeout=20_000)
    return [e.source for e in view.entries]


def after_progress(view, also) -> None:
    """`also(done, total)` runs after the view showed each progress report of the downloads that follow."""
    view._show_progress = lambda done, total: (type(view)._show_progress(view, done, total), also(done, total))


def download(view, qtbot) -> None:
    """Click Download and wait until it ended (for a GGUF repository: the file chosen, then its download)."""
    view.download_button.click()
    qtbot.waitUntil(view.download_button.isEnabled, timeout=30_000)


def test_download_with_progress_cancel_resume_then_use_the_model(make_window, qtbot, hub, tmp_path):
    w = make_window()
    w.open_models()
    view = w.models_view
    assert listed(view, qtbot)[0] == "bundled" and REPO not in view.entries
    view.hub_id.setText(REPO)
    hub.pause_s = 0.05  # slow enough to cancel part-way
    progress = []

    def cancel_early(done, total):
        progress.append((done, total))
        if done > total // 3 and not view._stop.is_set():
            view.cancel_download()  # a third of the way: inside the weights file

    after_progress(view, cancel_early)
    view.download_button.click()
    assert not view.download_button.isEnabled() and view.cancel_button.isEnabled()
    qtbot.waitUntil(view.download_button.isEnabled, timeout=30_000)
    assert "cancelled" in view.progress_text.text() and view.download_button.isEnabled()
    assert progress and progress[0][1] > 0 and progress[-1][0] < progress[-1][1]  # stopped part-way
    hub.pause_s = 0.0
    shown = []
    after_progress(view, lambda done, total: shown.append(view.progress_text.text()))
    download(view, qtbot)
    before = view.listings
    assert "Downloaded" in view.progress_text.text()
    assert hub.ranges(WEIGHTS) and hub.ranges(WEIGHTS)[-1] > 0  # resumed where the cancel left it
    assert any(" of " in text for text in shown)  # bytes done of the total, as it went
    assert REPO in listed(view, qtbot, before) and view.selected().source == REPO
    entry = view.selected()
    assert entry.where == "cache" and entry.architecture == "LlamaForCausalLM" and entry.context_length == 512
    snap(view, "models")
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        view.use_button.click()
    saved = json.loads((tmp_path / "config" / "settings.json").read_text())
    assert saved["model_source"] == REPO and w.settings.model_source == REPO
    listed(view, qtbot, view.listings)  # read again once the model loaded
    assert view.table.item(view.entries.index(view._loaded_entry()), 7).text().startswith("loaded")


def test_a_gguf_repository_asks_which_quantization(make_window, qtbot, hub, monkeypatch):
    from PySide6.QtWidgets import QInputDialog

    asked = []
    monkeypatch.setattr(QInputDialog, "getItem", lambda *a, **k: asked.append(a[3]) or (a[3][-1], True))
    w = make_window()
    w.open_models()
    view = w.models_view
    listed(view, qtbot)
    view.hub_id.setText(GGUF_REPO)
    download(view, qtbot)
    listed(view, qtbot, view.listings)
    assert asked and [label.split(" ")[0] for label in asked[0]] == ["tiny-Q4_1.gguf", "tiny-Q8_0.gguf"]
    assert "Downloaded" in view.progress_text.text() and view.selected().source.endswith("tiny-Q8_0.gguf")
    assert view.selected().quantization == "Q8_0"
    freed = []
    view.remove_selected(confirm=lambda: freed.append(True) or True)
    assert freed and "freed" in view.status.text()


def test_drafts_for_the_loaded_model_are_the_ones_with_its_vocabulary(make_window, qtbot, tiny_session):
    w = make_window()
    view = w.open_models() or w.models_view
    listed(view, qtbot)

    def entry(name, key):  # Hub ids: a load's sources are checked before the engine takes it
        return ModelEntry(f"org/{name}", name, "local", f"/m/{name}", 1 << 20, "LlamaForCausalLM", 2048, "bf16", key)

    from dataclasses import replace

    w.settings = w.settings.__class__(**{**w.settings.to_dict(), "model_source": "org/big"})
    w.loaded = replace(w.loaded, strategies=(*w.loaded.strategies, "eagle"))  # a trained head was found
    view._show_list([entry("big", "v1"), entry("small", "v1"), entry("other", "v2"), entry("unknown", "")])
    column = [view.table.item(row, 7).text() for row in range(4)]
    assert column == ["loaded · trained heads: eagle", "can draft (same vocabulary)", "", "vocabulary unknown"]
    memory = view.table.item(0, 3)  # what running it takes: its 1 MB of weights and about 1 GB of runtime
    assert memory.text() in ("about 1.0 GB (1.0 GB engine)", "1.0 GB: more than free") and "memory" in memory.toolTip()
    assert "Drafts for the loaded model: small." in view.status.text()
    view.select("org/other")
    assert not view.draft_button.isEnabled()
    view.select("org/small")
    assert view.draft_button.isEnabled()
    asked, load = [], tiny_session.load
    tiny_session.load = lambda request, progress=None: (asked.append(request), load(request, progress))[1]
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        view.draft_button.click()
    assert w.settings.draft_source == "org/small" and w.settings.strategy == "draft-model"
    assert asked[-1].draft == "org/small" and asked[-1].keep_target  # the model loaded now stays: only the draft is read


def test_a_draft_head_folder_is_offered_to_its_strategy_on_the_next_load(make_window, qtbot, tmp_path, tiny_models):
    from tests.app.conftest import ChatTokenizer
    from tests.support.tiny import loaded, random_medusa_head

    w = make_window()
    view = w.open_models() or w.models_view
    listed(view, qtbot)
    before = w.settings
    (tmp_path / "nothing").mkdir()
    view.add_head(str(tmp_path / "nothing"))
    assert "Not used:" in view.status.text() and "holds no draft head" in view.status.text()
    assert w.settings == before
    target = loaded(tiny_models[0])
    target.tokenizer = ChatTokenizer()
    head = random_medusa_head(target, tmp_path / "head")  # no medusa head is found for the model otherwise
    assert "medusa" not in w.loaded.strategies
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        view.add_head(str(head))
    assert w.settings.draft_head == str(head) and w.settings.strategy == "medusa" and "medusa" in w.loaded.strategies
    assert w.settings.load_request().draft_head == str(head)
    assert view.status.text().startswith("Loaded: the draft head in")


def test_a_draft_head_that_fails_to_load_is_said_in_the_view_and_changes_nothing(make_window, qtbot, tmp_path):
    """A folder that looks like a head but does not load (here an EAGLE config.json over weights that are not a
    head): the model loads without it, the Models view says why (it stayed on "Loading…"), and the strategy stays
    as it was (it was switched to eagle for the head) with no head kept."""
    import json

    w = make_window(strategy="prompt-lookup")
    view = w.open_models() or w.models_view
    listed(view, qtbot)
    before = w.settings
    not_a_head = tmp_path / "not_a_head-head"
    not_a_head.mkdir()
    (not_a_head / "config.json").write_text(json.dumps({"num_hidden_layers": 1, "hidden_size": 8}))
    (not_a_head / "model.safetensors").write_bytes(b"not weights")
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        view.add_head(str(not_a_head))
    assert view.status.text().startswith("Not used: ") and "stays as it was" in view.status.text()
    assert str(not_a_head) in view.status.text() and "unreadable" in view.status.text()
    assert w.settings.strategy == "prompt-lookup" and w.settings.draft_heads == before.draft_heads == {}
    assert w.controls.strategy.currentData() == "prompt-lookup" or "prompt" in w.controls.strategy.currentText().lower()
    assert not view.heads.isVisibleTo(view)  # no head kept, so none listed
    listed(view, qtbot, view.listings)
    assert view.status.text().startswith("Not used: ")  # the list read again keeps the line


def head_for(model, folder):
    """A Medusa head made for the tiny `model` (with the app's test tokenizer), saved in `folder`."""
    from tests.app.conftest import ChatTokenizer
    from tests.support.tiny import loaded, random_medusa_head

    target = loaded(model)
    target.tokenizer = ChatTokenizer()
    return random_medusa_head(target, folder)


def test_a_head_made_for_another_model_never_blocks_a_use(make_window, qtbot, tmp_path, tiny_models):
    """A settings file of the version that kept one draft head for every model, holding a head made for another
    model (the tiny target's perturbed copy): the model loads, the head is dropped from the settings for good, one
    line says why, and the strategy is the one chosen. Another model's head is never offered to the loaded one."""
    import json

    from specula.app.settings import SettingsStore

    other = head_for(tiny_models[1], tmp_path / "other-head")
    config = tmp_path / "config"
    config.mkdir()
    (config / "settings.json").write_text(json.dumps({"version": 10, "strategy": "prompt-lookup",
                                                      "model_source": "bundled", "draft_head": str(other)}))
    w = make_window()
    assert w.loaded is not None and w.loaded.dropped_head == str(other) and w.state == "ready"
    lines = [text for text in w.notices.messages if str(other) in text]
    assert len(lines) == 1 and "trained for another model" in lines[0] and "no longer kept" in lines[0]
    assert w.settings.draft_heads == {} and w.settings.strategy == "prompt-lookup"
    assert SettingsStore(config).load().settings.draft_heads == {}  # saved: the next start does not try it again
    mine = head_for(tiny_models[0], tmp_path / "my-head")
    w.apply_settings(w.settings.with_head(str(other), "elsewhere.gguf").with_head(str(mine)), reload=False)
    assert w.settings.load_request().draft_head == str(mine)  # the loaded model's own, not the other's


def test_the_models_view_lists_added_heads_each_for_its_model_and_removes_one(make_window, qtbot, tmp_path,
                                                                             tiny_models):
    """Add draft head keeps the head for the model it was added for: another model is used without it, and going back
    uses it again; the list shows each head with its model, and Remove forgets one (the loaded model's: loaded again
    without it)."""
    head = head_for(tiny_models[0], tmp_path / "head")
    w = make_window()
    view = w.open_models() or w.models_view
    listed(view, qtbot)
    assert not view.heads.isVisibleTo(view)
    with qtbot.waitSignal(w.model_ready, timeout=30_000):
        view.add_head(str(head))
    assert w.settings.draft_heads == {"bundled": str(head)} and "medusa" in w.loaded.strategies
    other = tmp_path / "other-model"  # loaded as the tiny model, as every model is here
    other.mkdir()
    (other / "config.json").write_text("{}")
    with qtbot.waitSignal(w.model_ready, timeout=30_000):  # another model: no head asked for, nothing dropped
        w.apply_settings(replace(w.settings, model_source=str(other)), reload=True)
    assert "medusa" not in w.loaded.strategies and not w.loaded.dropped_head
    assert w.settings.draft_heads == {"bundled": str(head)}
    with qtbot.waitSignal(w.model_ready, timeout=30_000):  # back to the head's model: it drafts again
        w.apply_settings(replace(w.settings, model_source="bundled"), reload=True)
    assert "medusa" in w.loaded.strategies
    w.apply_settings(w.settings.with_head(str(head), str(other)), reload=False)
    view.heads.refresh()
    assert view.heads.isVisibleTo(view) and view.heads.table.rowCount() == 2
    rows = [[view.heads.table.item(r, c).text() for c in range(3)] for r in range(2)]
    assert sorted(rows) == [["head", "bundled", "medusa"], ["head", "other-model", "medusa"]]
    assert not view.heads.remove_button.isEnabled()
    view.heads.table.selectRow([row[1] for row in rows].index("other-model"))  # another model's: forgotten
    view.heads.remove_button.click()
    assert w.settings.draft_heads == {"bundled": str(head)} and w.state == "ready"  # nothing reloads
    assert view.status.text() == "Removed the draft head head (it was added for other-model)."
    view.heads.table.selectRow(0)
    with qtbot.waitSignal(w.model_ready, timeout=30_000):  # the loaded model's: it loads again without it
        view.heads.remove_button.click()
    assert w.settings.draft_heads == {} and "medusa" not in w.loaded.strategies
    assert not view.heads.isVisibleTo(view)


def test_the_hub_is_searched_and_a_result_shows_its_size_and_quantizations(make_window, qtbot, hub):
    hub.downloads = {REPO: 3, GGUF_REPO: 90}
    hub.tags = {GGUF_REPO: ["gguf"]}
    w = make_window()
    w.open_models()
    view = w.models_view
    listed(view, qtbot)
    view.search_text.setText("tiny")
    view.search_button.click()
    qtbot.waitUntil(lambda: view.results.rowCount() == 2, timeout=20_000)
    assert [view.results.item(r, 0).text() for r in range(2)] == [GGUF_REPO, REPO]  # most downloaded first
    assert view.results.item(0, 1).text() == "90" and view.results.item(0, 3).text() == "GGUF"
    view.results.selectRow(0)
    assert view.hub_id.text() == GGUF_REPO  # Download takes it from here
    qtbot.waitUntil(lambda: "model files" in view.details.text(), timeout=20_000)
    assert "Q4_1" in view.details.text() and "Q8_0" in view.details.text() and "2 model files" in view.details.text()
    view.gguf_only.setChecked(True)
    view.search_button.click()
    qtbot.waitUntil(lambda: view.results.rowCount() == 1, timeout=20_000)
    snap(view, "models-hub-search")
    view.search_text.setText("nothing like it")
    view.search_button.click()
    qtbot.waitUntil(lambda: "No text-generation model" in view.details.text(), timeout=20_000)


def test_the_models_view_opens_within_the_screen_and_fits_800_by_600(make_window, qtbot, monkeypatch):
    """900x560 by default, cut to fit a smaller screen when it opens (layout.fit_to_screen, tested with the
    main window); its rows fit 800x600 (its buttons in two rows there, the Hub's title wrapped), so nothing
    hangs off the right edge."""
    from specula.app import layout, window

    fitted = []
    monkeypatch.setattr(window, "fit_to_screen", lambda widget: (fitted.append(widget), layout.fit_to_screen(widget)))
    w = make_window()
    w.open_models()
    view = w.models_view
    assert fitted == [view] and view.screen().availableGeometry().contains(view.geometry())
    hint = view.minimumSizeHint()
    assert hint.width() <= 800 - 20 and hint.height() <= 600 - 60, hint
    view.resize(780, 540)
    qtbot.wait(50)
    for child in (view.head_button, view.search_button, view.cancel_button):
        right = child.mapTo(view, child.rect().topRight()).x()
        assert child.isVisible() and right <= view.width(), (child.text(), right)
    for button in view.findChildren(QPushButton):  # none squeezed below its own size: they wrap instead
        assert not button.isVisible() or button.width() >= button.sizeHint().width(), button.text()
    # a failed download's reason is read whole (offline, it was cut at the view's edge)
    view.progress_text.setText("The download stopped: the Hugging Face Hub cannot be reached from this machine (no "
                               "network, or HF_HUB_OFFLINE is set). It resumes where it stopped once it can be.")
    qtbot.waitUntil(lambda: view.progress_text.height() >= view.progress_text.heightForWidth(view.progress_text.width()),
                    timeout=5_000)
    assert view.progress_text.minimumSizeHint().width() <= view.progress_text.width()  # it wraps, not cut off


def test_the_memory_a_model_needs_is_shown_against_what_is_free():
    from specula.app.models_view import _memory

    entry = ModelEntry("m.gguf", "m.gguf", "local", "/m/m.gguf", 3 << 30, "llama", 2048, "Q4_K_M", "")
    assert _memory(entry, 16 << 30) == ("about 4.0 GB (1.0 GB engine)", "Running it takes about 4.0 GB of memory: its weights (3.0 GB) "
                                        "and about 1.0 GB for Specula's engine itself (PyTorch, the tokenizer), besides "
                                        "what a long conversation adds; 16.0 GB is free now.")
    text, tip = _memory(entry, 2 << 30)
    assert text == "4.0 GB: more than free" and "more than the 2.0 GB free now" in tip
    assert _memory(entry, None)[0] == "about 4.0 GB (1.0 GB engine)"
    small = ModelEntry("b.gguf", "b.gguf", "local", "/m/b.gguf", 94 << 20, "llama", 2048, "Q4_1", "")
    assert _memory(small, None)[0] == "about 1.1 GB (1.0 GB engine)"  # says what the 1 GB beside 94 MB is


def test_after_esc_on_the_models_view_ctrl_n_starts_a_new_chat(make_window, qtbot):
    """Esc closes the Models view and gives the keyboard back to the chat window, so its Ctrl+N makes a new chat
    at once (the next question must not go into the chat the old model answered)."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from specula.app.history import Turn

    w = make_window()
    w.chat.conversations[w.chat.current_id] = w.chat.current.with_turn(Turn("user", "hi"))  # not empty: not reused
    before = w.chat.current_id
    w.open_models()
    view = w.models_view
    view.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is view, timeout=10_000)
    qtbot.keyClick(view, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not view.isVisible() and QApplication.activeWindow() is w, timeout=10_000)
    qtbot.keyClick(QApplication.focusWidget() or w, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: w.chat.current_id != before, timeout=10_000)
