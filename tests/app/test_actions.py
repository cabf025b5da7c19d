"""The links under messages, driven through the real Worker on a tiny random model: Regenerate the last
answer, Edit and resend a user message, Copy an answer without its ghost text, and switch an answer
between coloured tokens and rendered Markdown."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextFormat
from PySide6.QtWidgets import QApplication

from specula.app import actions
from specula.app.history import Conversation, TokenRecord, Turn
from specula.app.tokens import totals_of
from tests.app.conftest import action_links, click_link, saved_history, snap, wait_reply
from tests.app.test_streaming import colours_in, fragments


def roles(window) -> list[str]:
    return [t.role for t in window.chat.current.turns]


def saved_turns(tmp_path, window) -> list[Turn]:
    found, _ = saved_history(tmp_path).load_all()
    return list(next(c for c in found if c.id == window.chat.current_id).turns)


def test_regenerate_drops_the_last_answer_and_answers_again_with_the_current_strategy(make_window, qtbot, tmp_path):
    w = make_window(strategy="none", max_new_tokens=20)
    versions = lambda: [w.version_actions[n].isEnabled() for n in (actions.OLDER, actions.NEWER)]  # noqa: E731
    assert versions() == [False, False]  # an empty chat has no versions to browse (Alt+Left/Right were enabled)
    w.send_text("hello there")
    wait_reply(qtbot, w)
    first = w.chat.current.turns[-1]
    assert first.summary.startswith("tiny · none") and versions() == [False, False]  # the model that wrote it first
    assert [name for name, *_ in action_links(w.view)] == ["edit", "copy", "markdown", "regenerate"]
    combo = w.controls.strategy
    combo.setCurrentIndex(combo.findData("draft-model"))
    combo.activated.emit(combo.currentIndex())
    click_link(qtbot, w.view, actions.REGENERATE)
    assert w.state == "generating"
    ok, finished = wait_reply(qtbot, w)
    assert ok and roles(w) == ["user", "assistant"]
    answer = w.chat.current.turns[-1]
    assert answer is not first and answer.summary.startswith("tiny · draft-model") and answer.content == finished.text
    assert w.view.toPlainText().count("Assistant") == 1
    assert [t.role for t in saved_turns(tmp_path, w)] == ["user", "assistant"]
    # the earlier answer is kept as a version: ‹ 1/2 browses to it, by link or by Alt+Left / Alt+Right
    assert [v.summary.split(" · ")[1][:4] for v in answer.all_versions] == ["none", "draf"] and "2/2" in w.view.toPlainText()
    assert versions() == [True, False]
    assert [name for name, i, _ in action_links(w.view) if i == 1] == ["older", "copy", "markdown", "regenerate"]
    w.composer.input.setFocus()
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    shown = w.chat.current.turns[-1]
    assert shown.content == first.content and shown.version == 0 and "1/2" in w.view.toPlainText()
    assert versions() == [False, True]
    assert saved_turns(tmp_path, w)[-1].content == first.content  # the choice is saved
    assert [name for name, i, _ in action_links(w.view) if i == 1] == ["newer", "copy", "markdown", "regenerate"]
    click_link(qtbot, w.view, actions.NEWER)
    assert w.chat.current.turns[-1].content == finished.text and "2/2" in w.view.toPlainText()
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    assert w.chat.current.turns[-1].content == first.content
    # the dock draws the version shown from its own events (made in this session), also after another chat
    from specula.app.plots import EARLIER

    assert w.plots.notes.text() != EARLIER and w.plots.stat_labels["tps"].text() == totals_of(first.summary)["tps"]
    current = w.chat.current_id
    w.chat.new_conversation()
    w.chat.select(current)
    assert w.plots.notes.text() != EARLIER and w.plots.stat_labels["plain"].text() != "–"
    # only the last answer offers Regenerate, and it moves on when the conversation grows
    w.send_text("and again")
    wait_reply(qtbot, w)
    assert [m.content for m in w.chat.last_prompt()][:2] == ["hello there", first.content]  # the version shown
    links = action_links(w.view)
    assert [index for name, index, _ in links if name == "regenerate"] == [3]
    assert w.regenerate_action.isEnabled()
    snap(w, "regenerated")


def test_edit_puts_the_message_in_the_composer_and_sending_replaces_it(make_window, qtbot, tmp_path, tiny_session):
    w = make_window(strategy="prompt-lookup", max_new_tokens=12)
    for text in ("the first message", "the second message"):
        w.send_text(text)
        wait_reply(qtbot, w)
    assert roles(w) == ["user", "assistant"] * 2
    index = click_link(qtbot, w.view, actions.EDIT, which=0)
    assert index == 0
    assert w.composer.input.toPlainText() == "the first message" and w.composer.editing
    snap(w, "editing")
    w.composer.input.selectAll()
    qtbot.keyClicks(w.composer.input, "an edited message")
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    ok, _ = wait_reply(qtbot, w)
    assert ok and roles(w) == ["user", "assistant"] and not w.composer.editing
    assert w.chat.current.turns[0].content == "an edited message"
    assert tiny_session.target.tokenizer.conversations[-1] == [{"role": "user", "content": "an edited message"}]
    assert "the second message" not in w.view.toPlainText()
    assert [t.content for t in saved_turns(tmp_path, w) if t.role == "user"] == ["an edited message"]
    # the first message edited titles the chat as a new chat's would, in the list and saved
    assert w.chat.current.title == "an edited message"
    found, _ = saved_history(tmp_path).load_all()
    assert next(c for c in found if c.id == w.chat.current_id).title == "an edited message"


def test_an_edited_first_message_retitles_a_chat_unless_the_user_named_it():
    chat = Conversation("c").with_turn(Turn("user", "the first message")).with_turn(Turn("assistant", "yes"))
    assert chat.title == "the first message"
    assert chat.truncated(0).with_turn(Turn("user", "another question")).title == "another question"
    assert chat.truncated(1).title == "the first message"  # regenerating keeps the first message, and its title
    named = replace(chat, title="Trip plans")
    assert named.truncated(0).with_turn(Turn("user", "another question")).title == "Trip plans"


def test_cancelling_an_edit_keeps_the_conversation(make_window, qtbot):
    w = make_window(strategy="none", max_new_tokens=8)
    w.send_text("keep me")
    wait_reply(qtbot, w)
    click_link(qtbot, w.view, actions.EDIT)
    assert w.composer.editing
    qtbot.mouseClick(w.composer.edit_bar.cancel, Qt.MouseButton.LeftButton)
    assert not w.composer.editing and w.composer.input.toPlainText() == ""
    w.send_text("a new message")
    wait_reply(qtbot, w)
    assert [t.content for t in w.chat.current.turns if t.role == "user"] == ["keep me", "a new message"]


def test_copy_puts_the_answer_without_ghost_text_on_the_clipboard(make_window, qtbot):
    w = make_window(strategy="draft-model", strategy_options={"draft-model": {"confident": False}}, max_new_tokens=120)
    w.set_ghosts(True)
    w.send_text("hello there, tell me a story about a cat")
    ok, finished = wait_reply(qtbot, w)
    assert ok and any(r.origin == "rejected" for r in w.view.records)
    QApplication.clipboard().clear()
    click_link(qtbot, w.view, actions.COPY)
    copied = QApplication.clipboard().text()
    assert copied == finished.text
    assert copied == "".join(r.text for r in w.view.records if r.origin != "rejected")
    assert "copied" in w.statusBar().currentMessage()


def markdown_conversation() -> Conversation:
    text = "# Rain\n\nA *short* poem with `code`:\n\n```python\nprint('drip')\n```\n\n- one\n- two\n"
    tokens = tuple(TokenRecord(piece, "target") for piece in re.findall(r"\s*\S+", text))
    return Conversation("md", "Markdown", turns=(Turn("user", "a poem please"), Turn("assistant", text, tokens,
                                                                                       "none · 9 tokens")))


def code_blocks(document) -> list[str]:
    out, block = [], document.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
            out.append(block.text())
        block = block.next()
    return out


def test_answers_are_rendered_markdown_in_their_token_colours_and_switch_to_raw_tokens(make_window, qtbot, tmp_path):
    saved_history(tmp_path).save(markdown_conversation())
    w = make_window(strategy="draft-model", strategy_options={"draft-model": {"confident": False}}, max_new_tokens=30)
    assert w.chat.current_id == "md" and w.view.is_markdown(1)
    text = w.view.toPlainText()
    assert "# Rain" not in text and "Rain" in text and "```" not in text and "*short*" not in text
    assert code_blocks(w.view.document()) == ["print('drip')"]
    coloured = {fmt.anchorHref() for _, fmt, _ in fragments(w.view.document()) if fmt.anchorHref().startswith("t")}
    words = {f"t{i}" for i, r in enumerate(markdown_conversation().turns[1].tokens) if any(c.isalnum() for c in r.text)}
    assert words <= coloured  # every token with text to show is there in its format, hoverable (markers are not)
    w.send_text("another one `inline code` here")
    ok, finished = wait_reply(qtbot, w)
    assert ok and w.view.is_markdown(3)
    draft = w.view.colours.draft
    assert draft in colours_in(w.view.document())  # the new answer, rendered, keeps its accepted drafts' colour
    user = next(f for t, f, _ in fragments(w.view.document()) if "inline code" in t)
    assert user.fontFixedPitch() or "mono" in " ".join(user.fontFamilies()).lower()  # the user's code too
    assert [name for name, i, _ in action_links(w.view) if i == 1] == ["copy", "markdown"]
    assert "Tokens" in w.view.toPlainText()
    snap(w, "markdown")
    index = click_link(qtbot, w.view, actions.MARKDOWN, which=0)
    assert index == 1 and not w.view.is_markdown(1) and w.view.is_markdown(3)
    assert "# Rain" in w.view.toPlainText() and "print('drip')" not in code_blocks(w.view.document())
    click_link(qtbot, w.view, actions.MARKDOWN, which=0)
    assert w.view.is_markdown(1) and code_blocks(w.view.document()) == ["print('drip')"]
    w.set_ghosts(True)  # rejected drafts are drawn in the raw tokens: every answer shows them
    assert not w.view.is_markdown(1) and not w.view.is_markdown(3)
    assert {r.origin for r in w.view.records} >= {"draft", "rejected"}


@pytest.mark.parametrize("code", ["```python\nx = '" + "long " * 60 + "'\n```", "Indented:\n\n    y = '" + "long " * 60 + "'"])
def test_a_long_line_of_code_wraps_inside_its_bubble(qapp, code):
    """Fenced or indented, a code block's long line wraps at the bubble's width instead of widening the
    whole chat (which then scrolled sideways for every message)."""
    from PySide6.QtGui import QTextCursor, QTextDocument

    from specula.app.markdown import CODE_BACKGROUND, insert_markdown

    document = QTextDocument()
    insert_markdown(QTextCursor(document), "An answer.\n\n" + code, dark=False)
    block = document.lastBlock()
    assert block.blockFormat().background().color().name() == CODE_BACKGROUND[False]  # set as code
    document.setTextWidth(300)
    assert document.size().width() <= 300 + 1


@pytest.mark.parametrize("answer", ["```python\ndef f(n):\n    return n\n```\nThat is all.", "```\nonly = 1\n```"])
def test_an_answer_that_opens_with_code_has_its_first_line_inside_the_codes_box(qapp, answer):
    """The first line of an answer that opens with a code block sat outside the tinted box (it kept the bubble's
    own block, which the Markdown importer merges its first block into)."""
    from PySide6.QtGui import QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument

    from specula.app.markdown import CODE_BACKGROUND, insert_markdown

    document = QTextDocument()
    cursor = QTextCursor(document)
    cursor.insertText("Assistant")  # the bubble's header, then the block the answer is written in
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
    insert_markdown(cursor, answer, dark=False)
    code = answer.split("\n")[1:-1] if answer.endswith("```") else answer.split("\n")[1:3]
    block = document.begin().next()
    for line in code:
        assert block.text() == line and block.blockFormat().background().color().name() == CODE_BACKGROUND[False], line
        block = block.next()
    if block.isValid():
        assert block.text() == "That is all." and block.blockFormat().background().style().name == "NoBrush"


def test_the_context_menu_offers_the_same_actions(make_window, qtbot):
    from PySide6.QtCore import QTimer
    from PySide6.QtGui import QContextMenuEvent

    w = make_window(strategy="none", max_new_tokens=8)
    w.send_text("hello")
    wait_reply(qtbot, w)
    assert w.view.actions_of(0) == ((actions.EDIT, "Edit"),)
    assert [name for name, _ in w.view.actions_of(1)] == ["copy", "markdown", "regenerate"]
    point = w.view.cursorRect(_cursor_at(w.view, action_links(w.view)[-1][2])).center()
    assert w.view.item_at(point) == 1
    seen = []

    def pick_regenerate():
        menu = QApplication.activePopupWidget()
        seen.extend(a.text() for a in menu.actions())
        next(a for a in menu.actions() if a.text() == "Regenerate answer").trigger()
        menu.close()

    QTimer.singleShot(200, pick_regenerate)
    global_point = w.view.viewport().mapToGlobal(point)
    w.view.contextMenuEvent(QContextMenuEvent(QContextMenuEvent.Reason.Mouse, point, global_point))
    assert {"Copy answer", "Show raw tokens", "Regenerate answer"} <= set(seen)
    ok, _ = wait_reply(qtbot, w)
    assert ok and roles(w) == ["user", "assistant"]


def _cursor_at(view, position):
    from PySide6.QtGui import QTextCursor

    cursor = QTextCursor(view.document())
    cursor.setPosition(position)
    return cursor


def test_your_own_code_is_shown_without_its_fences_and_kept_as_typed(qapp):
    """A user's message is shown as typed but for its code: tinted and monospaced, without the ``` fence lines
    and backticks that stood in the bubble (the message itself keeps them, for Edit and the model)."""
    from PySide6.QtGui import QTextCursor, QTextDocument

    from specula.app.markdown import CODE_BACKGROUND, insert_with_code

    typed = "Fix the bug in `add`:\n```python\ndef add(a, b):\n    return a - b\n```\nThanks."
    document = QTextDocument()
    insert_with_code(QTextCursor(document), typed, dark=False)
    shown = document.toPlainText()
    assert "```" not in shown and "`" not in shown and "python" not in shown
    assert shown == "Fix the bug in add:\ndef add(a, b):\n    return a - b\nThanks."
    tinted = [f for t, f, _ in fragments(document) if "return a - b" in t][0]
    assert tinted.background().color().name() == CODE_BACKGROUND[False]
