"""The composer's keys and states, the strategy list from the registry, the status bar, the layout
memory, and the promise that the window can be imported and built without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest
from PySide6.QtCore import Qt

from specula.app.composer import Composer
from tests.app.conftest import load_without_draft, snap, wait_reply


def test_enter_sends_shift_enter_makes_a_new_line(qtbot):
    c = Composer()
    qtbot.addWidget(c)
    sent = []
    c.send_requested.connect(sent.append)
    assert not c.input.isEnabled() and not c.send_button.isEnabled()  # no model yet
    c.set_state(ready=True, generating=False)
    qtbot.keyClicks(c.input, "first line")
    qtbot.keyClick(c.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(c.input, "second line")
    assert sent == [] and c.input.toPlainText() == "first line\nsecond line"
    qtbot.keyClick(c.input, Qt.Key.Key_Return)
    assert sent == ["first line\nsecond line"] and c.input.toPlainText() == ""
    c.set_state(ready=True, generating=True)
    qtbot.keyClicks(c.input, "while busy")
    qtbot.keyClick(c.input, Qt.Key.Key_Return)
    assert len(sent) == 1 and c.stop_button.isEnabled() and not c.send_button.isEnabled()


def test_strategies_come_from_the_registry_and_the_status_bar_shows_the_model(make_window):
    from specula.engine.drafters import DRAFTERS

    w = make_window(strategy="layer-skip")
    combo = w.controls.strategy
    assert [combo.itemData(i) for i in range(combo.count())] == list(DRAFTERS)
    assert combo.currentData() == "layer-skip"
    status = " ".join(label.text() for label in w.status_labels.values()) + w.state_label.text()
    assert "tiny" in status and "cpu" in status and "fp32" in status and "layer-skip" in status and "ready" in status
    combo.setCurrentIndex(combo.findData("none"))
    combo.activated.emit(combo.currentIndex())
    assert w.settings.strategy == "none" and "none" in w.status_labels["strategy"].text()


def test_a_strategy_the_model_cannot_use_is_disabled(make_window, tiny_session):
    load_without_draft(tiny_session)
    w = make_window(strategy="draft-model")
    combo = w.controls.strategy
    item = combo.model().item(combo.findData("draft-model"))
    assert not item.isEnabled()
    assert w.settings.strategy != "draft-model" and w.strategy_unavailable == "draft-model"
    assert any("draft-model" in m for m in w.notices.messages)


def test_window_layout_is_remembered(make_window):
    from PySide6.QtWidgets import QApplication

    w = make_window()
    assert (w.width(), w.height()) == (1280, 800)
    assert not w.view.show_ghosts and not w.legend.ghosts.isChecked()  # rejected drafts: off until asked for
    w.splitter.setSizes([300, w.splitter.width() - 300])
    box = w.legend.ghosts.mapTo(w, w.legend.ghosts.rect().topLeft())
    w.legend.ghosts.setChecked(True)
    QApplication.processEvents()
    assert w.legend.ghosts.mapTo(w, w.legend.ghosts.rect().topLeft()) == box  # the key grows beside it, not under it
    w.close()
    again = make_window()
    assert again.size() == w.size()
    assert again.splitter.sizes()[0] == w.splitter.sizes()[0] == 300
    assert again.view.show_ghosts and again.legend.ghosts.isChecked() and again.ghost_action.isChecked()


def test_building_the_window_does_not_import_torch(tmp_path):
    code = (
        "import sys\n"
        "from PySide6.QtWidgets import QApplication\n"
        "qapp = QApplication([])\n"
        "import specula.app.window, specula.app.main\n"
        "w = specula.app.window.MainWindow()\n"
        "w.show(); qapp.processEvents()\n"
        "from specula.app.settings_dialog import SettingsDialog\n"
        "SettingsDialog(w.settings, w).deleteLater()  # opening Settings before a model loads\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')]\n"
        "assert not heavy, heavy[:5]\n"
        "w.close()\n"
        "import shiboken6; shiboken6.delete(w)  # before the QApplication goes (see specula.app.main._delete)\n"
        "print('ok')\n"
    )
    env = {**__import__("os").environ, "SPECULA_CONFIG_DIR": str(tmp_path / "c"), "SPECULA_DATA_DIR": str(tmp_path / "d"),
           "QT_QPA_PLATFORM": "offscreen"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_settings_dialog_saves_and_reloads_the_model(make_window, qtbot, monkeypatch, tmp_path, tiny_session):
    from specula.app.settings import SettingsStore
    from specula.app.settings_dialog import SettingsDialog

    from tests.app.test_settings import model_folder

    w = make_window(strategy="none", max_new_tokens=8)
    loads = []
    w.model_ready.connect(lambda: loads.append(w.loaded))
    other = model_folder(tmp_path)

    def edit_and_accept(dialog):
        dialog.model.setText(other)
        dialog.system.setPlainText("Answer in French.")
        dialog.seed.setText("7")
        return True

    monkeypatch.setattr(SettingsDialog, "exec", edit_and_accept)
    w.settings_action.trigger()
    assert w.state == "loading" and not w.composer.input.isEnabled()
    qtbot.waitUntil(lambda: w.state == "ready", timeout=60_000)
    assert loads  # the model was loaded again
    saved = SettingsStore(tmp_path / "config").load().settings
    assert (saved.model_source, saved.system_prompt, saved.seed) == (other, "Answer in French.", 7)
    w.send_text("bonjour")
    qtbot.waitUntil(lambda: w.state == "ready", timeout=60_000)
    template_input = tiny_session.target.tokenizer.conversations[-1]
    assert template_input[0] == {"role": "system", "content": "Answer in French."}


def test_the_app_survives_many_qt_calls_and_signals(tmp_path):
    """PySide6 6.12.0 on Python 3.11 drops a reference to None per void Qt call and to True per emit, so
    this loop aborts the interpreter there (pyproject.toml pins PySide6-Essentials below 6.12)."""
    code = (
        "from PySide6.QtCore import QObject, Signal\n"
        "class B(QObject):\n"
        "    ping = Signal(object)\n"
        "b = B(); seen = []\n"
        "b.ping.connect(seen.append)\n"
        "for i in range(100_000):\n"
        "    b.setObjectName('x'); b.ping.emit(i)\n"
        "assert len(seen) == 100_000\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"


def test_plot_axes_move_only_a_few_times_over_a_long_answer(qtbot):
    """An axis whose range changes is drawn again (ticks, labels, grid), which costs the window more
    than its curves: over 1,000 noisy steps each plot's range changes only a few times (a log scale)."""
    import random

    from specula.app.plots import PlotsPanel
    from specula.engine.api.events import BaselineCost, Loaded, Origin, Step, Token

    panel = PlotsPanel()
    qtbot.addWidget(panel)
    panel.set_model(Loaded(1, "m", None, "cpu", "bf16", 4096, ("none",), BaselineCost(0.02, 1e-6)))
    panel.begin()
    changes: dict[str, int] = {}
    original = panel._set_range

    def counting(key, *bounds):
        if panel._ranges.get(key) != bounds:
            changes[key] = changes.get(key, 0) + 1
        original(key, *bounds)

    panel._set_range = counting
    rng, elapsed = random.Random(0), 0.0
    for i in range(1, 1001):
        drafted = rng.randint(0, 6)
        accepted = rng.randint(0, drafted)
        elapsed += rng.uniform(0.005, 0.03)
        tokens = tuple(Token(j, "x", Origin.DRAFT if j < accepted else Origin.BONUS, i) for j in range(accepted + 1))
        panel.add_step(Step(1, i, drafted, accepted, tokens, (), 0.001, 0.01, 100 + i, 6, elapsed))
        if i % 10 == 0:
            panel.refresh()
    assert set(changes) == {"acceptance", "tps", "speedup", "lengths", "positions"}
    assert max(changes.values()) <= 10, changes  # in blocks of 32 steps the steps axis alone moved 31 times



def test_the_first_answer_does_not_draw_the_plots_again_while_the_prompt_is_read(qtbot):
    """The note covers the plots until the first step arrives, the plots were drawn once under it while the
    model loaded (each axis's picture made), and the value axes keep their width when the first tokens/s
    figures (hundreds) replace the empty plot's: no axis is made again or resized by the first answer's start."""
    from specula.app.plots import PlotsPanel
    from specula.engine.api.events import BaselineCost, Loaded, Origin, Step, Token

    panel = PlotsPanel()
    qtbot.addWidget(panel)
    panel.resize(380, 700)
    panel.show()
    qtbot.waitExposed(panel)
    panel.set_model(Loaded(1, "m", None, "cpu", "bf16", 4096, ("none",), BaselineCost(0.004, 1e-6)))
    axes = [panel.plots[key].getAxis("left") for key in panel.plots]
    assert all(axis.picture is None for axis in axes)  # hidden under the note: never drawn yet
    panel.draw_ahead()
    assert all(axis.picture is not None for axis in axes)
    widths = [axis.width() for axis in axes]
    panel.begin()
    assert not panel.empty.isHidden()  # the prompt is being read: nothing to draw yet
    elapsed = 0.0
    for i in range(0, 40):  # the prompt's step first, as an answer streams them
        elapsed += 0.004
        panel.add_step(Step(1, i, 0, 0, (Token(i, "x", Origin.TARGET, i),), (), 0.0, 0.004, 20 + i, 0, elapsed))
        assert panel.empty.isHidden()
    panel.refresh()
    assert panel._ranges["tps"][3] >= 200  # three-digit labels on the tokens/s axis
    assert [axis.width() for axis in axes] == widths


def test_a_rejected_line_break_is_drawn_as_a_mark_not_a_new_line():
    from specula.app.chatview import ghost_text

    assert ghost_text("a\nb") == "a↵b" and ghost_text("\r\n") == "↵" and ghost_text("\r") == "↵"
    assert ghost_text(" cat") == " cat"


def test_bidi_overrides_and_control_characters_are_shown_as_marks_and_kept_as_written(qtbot):
    """U+202E reversed the text after it in the window and control characters showed as boxes: the view and the
    chat list show them as marks (as Markdown, as tokens, as ghost drafts), and the stored text is unchanged."""
    from specula.app.chatview import ChatView
    from specula.app.history import Conversation, TokenRecord, Turn
    from specula.app.sidebar import ConversationList

    written = "abc\u202edef\x01\x1b[31m\x85 \u2066x\u2069\x7f"
    marked = "abc⟨U+202E⟩def␁␛[31m⟨U+0085⟩ ⟨U+2066⟩x⟨U+2069⟩␡"
    pieces = ["abc", "\u202e", "def\x01", "\x1b[31m\x85 ", "\u2066x\u2069\x7f"]
    tokens = tuple(TokenRecord(t, "target", i) for i, t in enumerate(pieces))
    ghost = TokenRecord("\u202eghost", "rejected", 9)
    turns = (Turn("user", written), Turn("assistant", written, tokens[:3] + (ghost,) + tokens[3:]),
             Turn("error", written), Turn("assistant", written))
    view = ChatView()
    qtbot.addWidget(view)
    view.show_turns(turns)
    for ghosts in (False, True, False):  # as Markdown, as tokens with the ghost drafts, as tokens
        view.set_show_ghosts(ghosts)
        text = view.toPlainText()
        assert not set("\u202e\u2066\u2069\x01\x1b\x85\x7f") & set(text)
        assert text.count(marked) == (3 if ghosts else 4) and ("def␁⟨U+202E⟩ghost␛[31m" in text) == ghosts
        view.toggle_markdown(1)
    assert view.item(0).content == written and view.item(1).content == written  # Copy and Edit take these
    sidebar = ConversationList()
    qtbot.addWidget(sidebar)
    sidebar.show_conversations([Conversation("x", written, 1e9, 1e9)], "x")
    assert sidebar.list.item(0).text() == marked and marked in sidebar.list.item(0).toolTip()


def test_ctrl_n_makes_a_new_chat_and_ctrl_comma_opens_the_settings(make_window, qtbot, monkeypatch):
    from PySide6.QtCore import Qt

    from specula.app.settings_dialog import SettingsDialog

    w = make_window()
    w.send_text("hello")
    qtbot.waitUntil(lambda: w.state == "ready", timeout=60_000)
    before = w.chat.current_id
    w.activateWindow()
    w.composer.input.setFocus()
    qtbot.keyClick(w.composer.input, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert w.chat.current_id != before and not w.chat.current.turns and len(w.chat.conversations) == 2
    opened = []
    monkeypatch.setattr(SettingsDialog, "exec", lambda dialog: opened.append(dialog) or 0)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Comma, Qt.KeyboardModifier.ControlModifier)
    assert len(opened) == 1


def test_a_small_window_folds_the_chat_list_away_and_fits_800_by_600(make_window, qtbot):
    w = make_window()
    assert w.sidebar.isVisible() and w.chats_action.isChecked()
    w.resize(800, 600)
    qtbot.waitUntil(lambda: w.width() == 800 and w.height() == 600, timeout=5_000)
    assert not w.sidebar.isVisible() and not w.chats_action.isChecked()
    assert w.minimumSizeHint().width() <= 800
    qtbot.waitUntil(lambda: w.view.width() >= 400, timeout=5_000)  # the transcript keeps room to read
    assert w.dock.isVisible() and w.dock.width() >= w.dock.minimumWidth()
    legend = w.legend
    assert legend.height() >= legend.layout().heightForWidth(legend.width())  # the key is never cut off
    w.chats_action.trigger()  # the user's choice holds at this width
    assert w.sidebar.isVisible()
    w.resize(1280, 800)
    qtbot.waitUntil(lambda: w.width() == 1280, timeout=5_000)
    assert w.sidebar.isVisible() and w.chats_action.isChecked()
    snap(w, "window-1280")


def test_the_theme_switches_between_light_and_dark_and_is_remembered(make_window, qtbot):
    from PySide6.QtWidgets import QApplication

    from specula.app.theme import DARK, LIGHT

    w = make_window()
    try:
        assert w.theme == "system" and w.theme_actions["system"].isChecked()
        w.theme_actions["dark"].trigger()
        qtbot.waitUntil(lambda: w.view.colours == DARK, timeout=5_000)
        assert QApplication.instance().palette().base().color().lightness() < 64
        assert w.plots.graphics.backgroundBrush().color().lightness() < 64  # the plots follow
        assert DARK.draft in w.legend.entries["draft"].text()  # and the colour key
        assert w.plots.empty.palette().color(w.plots.empty.backgroundRole()).lightness() < 64
        # an unchecked check box is framed so that it shows (Fusion's frame was a shade darker than the window)
        from PySide6.QtWidgets import QStyle, QStyleOptionButton

        box = w.legend.ghosts
        assert not box.isChecked()
        option = QStyleOptionButton()
        box.initStyleOption(option)
        frame = box.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, option, box)
        image = box.grab().toImage()
        bright = sum(image.pixelColor(x, y).lightness() > 100 for x in range(frame.left(), frame.right() + 1)
                     for y in range(frame.top(), frame.bottom() + 1))
        assert bright >= frame.width() * 2, (bright, frame)
        snap(w, "window-dark")
        w.close()
        again = make_window()
        assert again.theme == "dark" and again.theme_actions["dark"].isChecked() and again.view.colours == DARK
        again.theme_actions["light"].trigger()
        qtbot.waitUntil(lambda: again.view.colours == LIGHT, timeout=5_000)
        assert QApplication.instance().palette().base().color().lightness() > 200
    finally:
        from specula.app.theme import apply_theme

        apply_theme(QApplication.instance(), "light")  # the next tests start light


def test_rendered_characters_are_traced_back_to_the_source_they_show():
    from specula.app.markdown import align

    source = "# Rain\n\nA *short* [poem](http://example.com/a/long/path) here"
    rendered = "Rain\u2029A short poem here"
    at = align(source, rendered)
    assert [source[i] for i in at if i is not None] == list("Rain\nA short poem here")
    assert at[0] == 2 and at[rendered.index("p")] == source.index("poem") and at[-1] == len(source) - 1


@pytest.mark.parametrize("strategy", ["prompt-lookup", "none"])
def test_the_docks_three_figures_agree_for_an_answer(make_window, qtbot, strategy):
    """tokens/s ÷ plain tokens/s = speedup, as shown (the dock's one definition), and plain decoding reads
    exactly 1; every figure says what it measures."""
    from specula.app.plots import _number
    from tests.app.conftest import wait_reply

    w = make_window(strategy=strategy, max_new_tokens=60)
    w.send_text("Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.")
    _, finished = wait_reply(qtbot, w)
    labels = w.plots.stat_labels
    tps, plain, speedup = (_number(labels[key].text()) for key in ("tps", "plain", "speedup"))
    if labels["speedup"].text() == "n/a":  # a busy machine: the figure's error is over UNSURE of it, and says so
        from specula.engine.api.metrics import UNSURE

        assert strategy != "none" and finished.speedup_err > UNSURE * finished.speedup
        return
    assert tps and plain and speedup, {k: v.text() for k, v in labels.items()}
    assert abs(tps / plain - speedup) <= 0.01 * speedup + 0.06 * tps / plain**2 + 0.005  # rounding of the shown figures
    if strategy == "none":
        assert labels["speedup"].text() == "1.00×" and labels["plain"].text() == labels["tps"].text()
    assert all(label.toolTip() for label in labels.values())


def test_answers_made_while_the_decoding_step_is_prepared_say_so(make_window, qtbot, monkeypatch):
    from specula.app.chat import ChatController
    from specula.app.tokens import EAGER_NOTE
    from specula.engine.models.loading import LoadedModel
    from tests.app.conftest import wait_reply

    kind = LoadedModel  # what the session's target is once the window loads it
    monkeypatch.setattr(kind, "step_status", property(lambda self: "compiling"))
    w = make_window(strategy="none", max_new_tokens=8)
    assert w.loaded.step == "compiling"  # said as soon as the model is ready, not at the first message
    assert w.statusBar().currentMessage() == ChatController.PREPARING
    w.send_text("hello")
    wait_reply(qtbot, w)
    assert w.statusBar().currentMessage() == ChatController.PREPARING
    assert w.statusBar().toolTip() == ChatController.PREPARING_TIP
    assert EAGER_NOTE in w.chat.current.turns[-1].summary
    monkeypatch.setattr(kind, "step_status", property(lambda self: "compiled"))
    w.send_text("again")
    wait_reply(qtbot, w)
    assert w.statusBar().currentMessage() == ChatController.READY
    assert w.statusBar().toolTip() == ""
    assert EAGER_NOTE not in w.chat.current.turns[-1].summary


def test_the_step_an_answer_starts_on_crosses_the_wire():
    from specula.engine.api.events import Loaded, Started
    from specula.engine.api.wire import loaded_from, loaded_json, started_from, started_json

    for event in (Started(4, "eagle", 12, 5, "compiling"), Started(4, "none", 3, 1)):
        assert started_from(started_json(event), 4) == event
    loaded = Loaded(2, "m", None, "cpu", "bf16", 4096, ("none",), step="compiling")
    assert loaded_from(loaded_json(loaded), 2) == loaded


def test_the_colour_legend_explains_each_colour_not_only_names_it(qtbot):
    from specula.app.legend import LegendBar
    from specula.app.theme import LEGEND, LIGHT

    legend = LegendBar(LIGHT)
    qtbot.addWidget(legend)
    tips = {origin: legend.entries[origin].toolTip() for origin, _ in LEGEND}
    assert len(set(tips.values())) == len(LEGEND)
    for origin, caption in LEGEND:
        assert len(tips[origin]) > 2 * len(caption) + 40 and not tips[origin].lower().startswith(caption), origin


def test_a_long_prompt_shows_how_far_it_has_been_read(make_window, qtbot, monkeypatch):
    from specula.engine.decoding import loop
    from tests.app.conftest import wait_reply

    monkeypatch.setattr(loop, "PROMPT_CHUNK", 16)
    monkeypatch.setattr(loop, "PROGRESS_AFTER_S", 0.0)
    w = make_window(strategy="none", max_new_tokens=4)
    said, in_bubble = [], []
    w.chat.reading.connect(said.append)
    w.chat.reading.connect(lambda text: in_bubble.append(w.view.toPlainText()))
    w.send_text("tell me about the cat and the dog " * 6)
    wait_reply(qtbot, w)
    assert said and said[0].startswith("Reading the prompt: 16 of ") and " left" in said[0]
    assert said[-1] == "" and w.statusBar().currentMessage() == ""  # cleared once the answer began
    # the answer's bubble says it too while it has no token (an empty box before), and no longer once it has
    assert any(said[0] in text for text in in_bubble)
    assert "Reading the prompt" not in w.view.toPlainText()


def test_the_toolbars_overflow_arrow_is_drawn_in_the_themes_text_colour(make_window, qtbot):
    from PySide6.QtGui import QPalette
    from PySide6.QtWidgets import QApplication, QToolBar, QToolButton

    w = make_window()
    for theme in ("dark", "light"):
        w.set_theme(theme)
        colour = QApplication.instance().palette().color(QPalette.ColorRole.ButtonText)
        button = w.findChild(QToolBar).findChild(QToolButton, "qt_toolbar_ext_button")
        image = button.icon().pixmap(32, 32).toImage()
        inked = {image.pixelColor(x, y).rgb() for x in range(32) for y in range(32) if image.pixelColor(x, y).alpha() > 200}
        assert colour.rgb() in inked, theme
    w.set_theme("light")


def test_a_short_plots_value_labels_are_spread_apart(qapp):
    """pyqtgraph draws every major label even where they overlap (an 800x600 screen: "150 100 50" in 45
    pixels); the plots' value axis spreads them to at least MIN_PIXELS and leaves a tall plot as it was."""
    import pyqtgraph as pg

    from specula.app.plots import SparseAxis

    axis, plain = SparseAxis("left"), pg.AxisItem("left")
    for low, high, size in ((0, 160, 45), (0, 1.05, 40), (0.5, 2.5, 30), (0, 40, 60)):
        spacing = axis.tickSpacing(low, high, size)[0][0]
        assert spacing / (high - low) * size >= SparseAxis.MIN_PIXELS, (low, high, size)
        assert plain.tickSpacing(low, high, size)[0][0] / (high - low) * size < SparseAxis.MIN_PIXELS  # it would crowd
        assert f"{spacing:.0e}"[0] in "125"  # a round spacing
    assert axis.tickSpacing(0, 1.05, 40)[0][0] == 0.5  # acceptance on an 800x600 screen: 0, 0.5, 1
    assert axis.tickSpacing(0, 160, 400) == plain.tickSpacing(0, 160, 400)


def test_an_answer_stopped_before_its_second_token_shows_no_rate():
    """"0.0 tok/s" on a cancelled answer: a rate needs two tokens and some time between them; the line leaves it out
    (and the plots' saved totals read no figure from it), where a longer answer keeps it."""
    from specula.app.tokens import summary, totals_of
    from specula.engine.api.events import Finished, Totals

    def finished(tokens: int, wall: float) -> Finished:
        totals = Totals(tokens, max(0, tokens - 1), tokens, 0, 0, wall, 0.05, 0.0, 0.0)
        return Finished(1, "cancelled", "x" * tokens, tuple(range(tokens)), totals)

    for tokens in (0, 1):
        line = summary("none", finished(tokens, 0.05))
        assert "tok/s" not in line and line.endswith("stopped") and "tps" not in totals_of(line)
    # one token, and a drafted pass that only ended it: no "0.50 tokens/step"
    ended = Finished(1, "eos", "x", (0,), Totals(1, 1, 2, 3, 0, 0.5, 0.4, 0.01, 0.09))
    assert "tokens/step" not in summary("auto", ended) and "acceptance 0%" in summary("auto", ended)
    assert summary("none", finished(1, 0.05)).startswith("none · 1 token ·")
    line = summary("none", finished(11, 0.15))
    assert "11 tokens · 100.0 tok/s" in line and totals_of(line)["tps"] == "100.0"
    from specula.app.tokens import model_label

    named = summary("none", finished(11, 0.15), model=model_label("qwen-coder-1.5b.gguf"))
    assert named.startswith("qwen-coder-1.5b · none · 11 tokens") and totals_of(named) == totals_of(line)
    # a speedup too unsure to tell (a few plain steps timed): said, and read back as no figure
    from dataclasses import replace

    unsure = replace(finished(6, 0.5), speedup=1.88, speedup_err=0.93)
    footer = summary("auto", unsure)
    assert "speedup n/a (too few plain steps timed)" in footer and "1.88" not in footer
    assert totals_of(footer)["speedup"] == "n/a"


def test_at_1024_px_the_chat_column_has_the_most_of_the_width(make_window, qtbot):
    """At 1024x700 the chat list (230 px) and the plots (380) left the chat column about 290 px of text, and code
    wrapped mid-expression: below 1200 px the list folds away, and the plots keep at most a third of the width."""
    w = make_window()
    w.resize(1024, 700)
    qtbot.waitUntil(lambda: w.width() == 1024 and not w.sidebar.isVisible(), timeout=5_000)
    qtbot.waitUntil(lambda: w.dock.width() <= max(w.dock.minimumWidth(), 1024 // 3), timeout=5_000)
    assert w.dock.isVisible() and w.view.viewport().width() >= 600  # about 80 characters of code
    w.chats_action.setChecked(True)  # the user's choice holds, and the chat stays readable beside the list
    qtbot.waitUntil(lambda: w.sidebar.isVisible() and w.view.width() >= w.readable_width(), timeout=5_000)
    assert w.dock.isVisible()


def test_with_the_chat_list_open_in_a_small_window_the_chat_keeps_a_readable_width(make_window, qtbot):
    """800x600 with ☰ Chats open: the chat column kept about 170 px (a syllable a line) because the plots kept
    their width. The list narrows and the plots give way (said in the status bar), and come back with the room."""
    w = make_window()
    w.resize(800, 600)
    qtbot.waitUntil(lambda: not w.chats_action.isChecked(), timeout=5_000)  # a narrow window folds the list away
    assert w.dock.isVisible()
    w.chats_action.setChecked(True)
    qtbot.waitUntil(lambda: w.sidebar.isVisible() and w.view.width() >= w.readable_width(), timeout=5_000)
    assert not w.dock.isVisible() and "Plots hidden" in w.statusBar().currentMessage()
    w.chats_action.setChecked(False)
    qtbot.waitUntil(lambda: w.dock.isVisible(), timeout=5_000)  # the room is back: so are the plots
    assert w.view.width() >= w.readable_width()
    w.resize(1400, 800)
    w.chats_action.setChecked(True)
    qtbot.wait(50)
    assert w.dock.isVisible() and w.sidebar.isVisible()  # a window wide enough keeps all three


def test_file_dialogs_open_where_such_files_are_not_in_the_processs_folder(make_window, qtbot, monkeypatch, tmp_path):
    """The export and model dialogs opened in the folder the process was started in (a launcher's): now Documents
    for an export and Downloads for a model (else the home folder), then wherever the user last chose one."""
    from pathlib import Path

    from PySide6.QtCore import QStandardPaths
    from PySide6.QtWidgets import QFileDialog

    from specula.app import folders

    monkeypatch.setattr(folders, "_LAST", {})
    opened = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda parent, title, where, kinds: (
        opened.append(where) or (str(tmp_path / "saved.md"), kinds))))
    w = make_window(strategy="none", max_new_tokens=4)
    w.send_text("hello")
    wait_reply(qtbot, w)
    w.export_conversation(w.chat.current_id, "md")
    documents = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation)
    expected = documents if documents and Path(documents).is_dir() else str(Path.home())
    assert Path(opened[0]).parent == Path(expected) and Path(opened[0]).parent != Path.cwd()
    assert (tmp_path / "saved.md").is_file()
    w.export_conversation(w.chat.current_id, "md")
    assert Path(opened[1]).parent == tmp_path  # where the last one went
    assert folders.start_folder("model") != str(Path.cwd()) or Path.cwd() == Path.home()
    assert folders.chosen("model", str(tmp_path / "m.gguf")) == str(tmp_path / "m.gguf")
    assert folders.start_folder("model") == str(tmp_path) and folders.chosen("model", "") == ""


def test_at_800x600_with_the_chats_folded_the_plots_and_a_long_status_line_fit(make_window, qtbot):
    """The dock's plots fit its width (a title wider than its plot widened them past the dock, which cut the plots
    and titles off: a narrow plot's title goes on two lines), and a status line longer than its room is cut with an
    ellipsis, its whole text the bar's tooltip."""
    w = make_window()
    w.resize(800, 600)
    qtbot.waitUntil(lambda: w.width() == 800, timeout=5_000)
    if w.sidebar.isVisible():
        w.chats_action.trigger()
    graphics = w.plots.graphics
    qtbot.waitUntil(lambda: graphics.ci.size().width() <= graphics.viewport().width() + 1, timeout=5_000)
    assert any("<br>" in plot.titleLabel.text for plot in w.plots.plots.values())
    from specula.engine.cpu.step import build_estimate, building_note

    line = building_note()  # the longest line of a load: the wait it announces is what must show
    w.status_labels["model"].setText("qwen-coder-1.5b.gguf")  # a real model's name, and the bar of a load
    w.busy.setVisible(True)
    w.statusBar().showMessage(line)
    qtbot.waitUntil(lambda: w.statusBar().currentMessage().endswith("…"), timeout=5_000)
    shown = w.statusBar().currentMessage()
    assert shown.endswith("…") and line.startswith(shown[:-1]) and w.statusBar().toolTip() == line
    assert f"about {round(build_estimate())} s" in shown
    w.busy.setVisible(False)
    w.statusBar().showMessage("Loaded tiny")
    assert w.statusBar().currentMessage() == "Loaded tiny" and w.statusBar().toolTip() == ""
    # a label filled in after the message (the model's name once loaded) leaves it less room: cut again
    w.statusBar().showMessage(line[:60], 60_000)
    w.status_labels["model"].setText("a model name long enough to take most of the bar " * 2)
    qtbot.waitUntil(lambda: w.statusBar().currentMessage().endswith("…"), timeout=5_000)
    assert w.statusBar().toolTip() == line[:60]
