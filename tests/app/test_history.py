"""Conversations saved and reopened through the window, a corrupt database set aside, multi-turn context."""

from __future__ import annotations

from dataclasses import replace

from specula.app.history import Conversation, TokenRecord, Turn, chat_messages, new_id
from specula.app.history_db import ConversationDB
from specula.app.sidebar import WHEN_ROLE
from tests.app.conftest import click_link, saved_history, snap, wait_reply


def sample() -> Conversation:
    conv = Conversation(new_id())
    conv = conv.with_turn(Turn("user", "What is the capital of France? Answer in one word please"))
    tokens = (TokenRecord("Par", "target", 0), TokenRecord("is", "draft", 1, 0, 0.9, 0.8),
              TokenRecord("!", "rejected", 1, 1, 0.1, 0.7), TokenRecord(".", "correction", 1))
    return conv.with_turn(Turn("assistant", "Paris.", tokens, "draft-model · 3 tokens"))


def test_a_conversation_round_trips(tmp_path):
    store = ConversationDB(tmp_path / "conversations.db")
    conv = sample()
    store.save(conv)
    found, notices = ConversationDB(tmp_path / "conversations.db").load_all()
    assert found == [conv] and notices == []
    assert conv.title.startswith("What is the capital of France?") and conv.title.endswith("…")


def test_a_corrupt_database_is_set_aside_and_a_new_one_started(tmp_path):
    (tmp_path / "conversations.db").write_bytes(b"this is not a database" * 100)
    store = ConversationDB(tmp_path / "conversations.db")
    found, notices = store.load_all()
    assert found == [] and len(notices) == 1 and "moved to conversations.db.corrupt-" in notices[0]
    assert [p.name.split(".corrupt-")[0] for p in tmp_path.glob("*.corrupt-*")] == ["conversations.db"]
    store.save(sample())
    assert len(ConversationDB(tmp_path / "conversations.db").load_all()[0]) == 1


def test_chat_messages_carry_the_whole_conversation():
    conv = sample().with_turn(Turn("user", "too long")).with_turn(Turn("error", "prompt is too long"))
    conv = conv.with_turn(Turn("user", "And Germany?"))
    messages = chat_messages(conv, "Be brief.")
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Be brief."), ("user", sample().turns[0].content), ("assistant", "Paris."), ("user", "And Germany?")]


def test_a_markdown_export_closes_a_code_block_an_answer_left_open():
    """An answer cut by the token limit inside a code block: the export closes the block at the answer's end, so
    that its footer and the next message are not read as code; a closed block is left as it is."""
    from specula.app.history import closed_fences, to_markdown

    cut = Turn("assistant", "Here:\n\n```python\ndef f(x):\n    return x +", (), "64 tokens · hit the token limit")
    conv = Conversation("x", "Code").with_turn(Turn("user", "code please")).with_turn(cut).with_turn(Turn("user", "more"))
    lines = to_markdown(conv).splitlines()
    at = lines.index("    return x +")
    assert lines[at + 1 : at + 4] == ["```", "", "*64 tokens · hit the token limit*"]
    assert sum(line.startswith("```") for line in lines) == 2
    closed = "a\n```py\nx = 1\n```\nb"
    assert closed_fences(closed) == closed
    assert closed_fences("````md\n```py\nx\n```") == "````md\n```py\nx\n```\n````"  # a shorter fence is content
    assert closed_fences("~~~\ncode") == "~~~\ncode\n~~~"
    assert closed_fences("1. step\n   ```sh\n   ls") == "1. step\n   ```sh\n   ls\n   ```"  # in a list item
    for text in ("use ``` inline", "```js `x` is no fence"):
        assert closed_fences(text) == text


def test_the_model_sees_earlier_turns_and_history_is_saved(make_window, qtbot, tiny_session, tmp_path):
    w = make_window(strategy="prompt-lookup", max_new_tokens=12)
    w.send_text("first question")
    ok, first = wait_reply(qtbot, w)
    w.send_text("second question")
    ok2, _ = wait_reply(qtbot, w)
    assert ok and ok2
    template_input = tiny_session.target.tokenizer.conversations[-1]
    assert template_input == [{"role": "user", "content": "first question"},
                              {"role": "assistant", "content": first.text},
                              {"role": "user", "content": "second question"}]
    found, _ = saved_history(tmp_path).load_all()
    assert len(found) == 1 and [t.role for t in found[0].turns] == ["user", "assistant", "user", "assistant"]
    assert found[0].turns[1].tokens and found[0].turns[1].summary


def test_conversations_can_be_added_renamed_deleted_and_reopened(make_window, qtbot, monkeypatch, tmp_path):
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QLineEdit, QMessageBox

    w = make_window(strategy="none", max_new_tokens=8)
    w.send_text("a saved chat")
    wait_reply(qtbot, w)
    first = w.chat.current_id
    qtbot.mouseClick(w.sidebar.new_button, _left())
    assert w.chat.current_id != first and w.view.toPlainText() == ""
    assert w.sidebar.list.count() == 2
    w.sidebar.list.setCurrentRow(1)
    assert w.chat.current_id == first and "a saved chat" in w.view.toPlainText()
    w.sidebar.start_rename()  # an inline editor, as with the Rename button or F2
    editor = w.sidebar.list.findChild(QLineEdit)
    assert editor is not None
    editor.selectAll()
    qtbot.keyClicks(editor, "Renamed chat")
    qtbot.keyClick(editor, Qt.Key.Key_Return)  # the delegate commits on the next event loop pass
    qtbot.waitUntil(lambda: w.chat.conversations[first].title == "Renamed chat", timeout=5_000)
    assert w.sidebar.list.currentItem().text() == "Renamed chat"
    assert next(c for c in saved_history(tmp_path).load_all()[0] if c.id == first).title == "Renamed chat"
    records = len(w.view.records)
    reopened = make_window()
    assert reopened.chat.current_id == first and len(reopened.view.records) == records
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(w.sidebar.delete_button, _left())
    assert first not in w.chat.conversations and first not in [c.id for c in saved_history(tmp_path).load_all()[0]]


def _left():
    from PySide6.QtCore import Qt

    return Qt.MouseButton.LeftButton


def test_an_answer_cut_by_the_engine_before_its_first_token_is_kept_as_interrupted(make_window, qtbot, tiny_session,
                                                                                 tmp_path):
    """The engine failing (killed, out of memory) after an answer started but before its first token left an empty
    answer marked done: the question then ran into the next one in later prompts. It is marked interrupted."""
    generate = tiny_session.generate

    def dies_before_its_first_token(*args, **kwargs):
        for event in generate(*args, **kwargs):
            if type(event).__name__ == "Step":
                raise RuntimeError("the engine process stopped")
            yield event

    tiny_session.generate = dies_before_its_first_token
    w = make_window(strategy="none", max_new_tokens=8)
    w.send_text("first question")
    ok, _ = wait_reply(qtbot, w)
    assert not ok
    _, answer, error = w.chat.current.turns
    assert (answer.role, answer.content, answer.interrupted, error.role) == ("assistant", "", True, "error")
    tiny_session.generate = generate
    w.send_text("second question")
    assert wait_reply(qtbot, w)[0]
    assert tiny_session.target.tokenizer.conversations[-1] == [{"role": "user", "content": "second question"}]
    saved = saved_history(tmp_path).load(w.chat.current_id).turns
    assert [(t.role, t.interrupted) for t in saved[:3]] == [("user", False), ("assistant", True), ("error", False)]


def test_a_failed_save_keeps_everything_says_where_and_is_retried(make_window, qtbot, tmp_path):
    import sqlite3

    w = make_window(strategy="prompt-lookup", max_new_tokens=12)
    w.send_text("saved before")
    wait_reply(qtbot, w)
    w.chat._retry.setInterval(100)
    other = sqlite3.connect(tmp_path / "history" / "conversations.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the database: every save fails
    w.send_text("typed while it fails")
    ok, _ = wait_reply(qtbot, w)
    assert ok and "typed while it fails" in w.view.toPlainText()
    assert any("Not saved" in m and "conversations.db" in m for m in w.notices.messages)
    snap(w, "not-saved")
    assert len([m for m in w.notices.messages if "Not saved" in m]) == 1  # one banner, not one per try
    assert w.composer.send_button.isEnabled() and w.state == "ready"
    assert w.chat.unsaved == {w.chat.current_id}
    other.execute("ROLLBACK")
    qtbot.waitUntil(lambda: not w.chat.unsaved, timeout=5_000)
    assert not any("Not saved" in m for m in w.notices.messages)
    saved = next(c for c in saved_history(tmp_path).load_all()[0] if c.id == w.chat.current_id)
    assert [t.role for t in saved.turns] == ["user", "assistant", "user", "assistant"]
    assert saved.turns == w.chat.current.turns


def test_the_chat_list_dates_a_chat_by_its_last_message():
    from datetime import datetime

    from specula.app.sidebar import when_text

    now = datetime(2026, 12, 1, 15, 30).timestamp()
    at = lambda *when: datetime(*when).timestamp()  # noqa: E731
    assert when_text(at(2026, 12, 1, 9, 5), now) == "09:05"
    assert when_text(at(2026, 11, 30, 23, 59), now) == "Yesterday"
    assert when_text(at(2026, 11, 27, 12, 0), now) == "Fri"
    assert when_text(at(2026, 11, 24, 12, 0), now) == "24 Nov"  # a week ago or more: the date
    assert when_text(at(2025, 12, 24, 12, 0), now) == "24 Dec 2025"


def test_search_finds_chats_by_their_words_and_a_chat_exports_as_markdown_and_json(make_window, qtbot, tmp_path):
    import json

    from PySide6.QtCore import Qt

    w = make_window(strategy="none", max_new_tokens=6)
    w.send_text("tell me about zebras")
    wait_reply(qtbot, w)
    zebras = w.chat.current_id
    w.chat.new_conversation()
    w.send_text("and now giraffes")
    wait_reply(qtbot, w)
    assert w.sidebar.list.count() == 2
    w.sidebar.search.setText("zebras")
    qtbot.waitUntil(lambda: w.sidebar.list.count() == 1, timeout=5_000)
    item = w.sidebar.list.item(0)
    assert item.data(Qt.ItemDataRole.UserRole) == zebras and "[zebras]" in item.toolTip()
    assert "Last message: " in item.toolTip() and ":" in item.data(WHEN_ROLE)  # today's: the time, e.g. 14:05
    snap(w, "search")
    w.sidebar.search.setText("nothing-like-this")
    qtbot.waitUntil(lambda: w.sidebar.list.count() == 0, timeout=5_000)
    w.sidebar.search.clear()
    qtbot.waitUntil(lambda: w.sidebar.list.count() == 2, timeout=5_000)
    w.export_conversation(zebras, "md", str(tmp_path / "z.md"))
    w.export_conversation(zebras, "json", str(tmp_path / "z.json"))
    text = (tmp_path / "z.md").read_text()
    assert text.startswith("# tell me about zebras") and "**You**\n\ntell me about zebras" in text
    data = json.loads((tmp_path / "z.json").read_text())
    assert [t["role"] for t in data["turns"]] == ["user", "assistant"] and data["turns"][1]["tokens"]
    w.sidebar._menu(w.sidebar.list.visualItemRect(w.sidebar.list.item(0)).center())
    assert [a.text() for a in w.sidebar.menu.actions() if a.text()] == [
        "Rename", "Export as Markdown…", "Export as JSON…", "Delete…"]
    w.sidebar.menu.close()


def test_a_long_conversation_opens_at_its_end_and_shows_earlier_turns_on_demand(make_window, qtbot, tmp_path):
    from PySide6.QtCore import QUrl

    from specula.app.chatview import EARLIER

    conv = Conversation("long", "A long one")
    for i in range(300):
        tokens = tuple(TokenRecord(f"w{j} ", "draft", j, 0) for j in range(100))
        conv = conv.with_turn(Turn("user", f"question {i}")).with_turn(Turn("assistant", f"answer {i}", tokens))
    saved_history(tmp_path).save(conv)
    w = make_window(strategy="none", max_new_tokens=6)
    assert w.chat.current_id == "long"
    qtbot.waitUntil(lambda: "long" in w.chat.loaded, timeout=10_000)  # 600 turns: read on a thread
    view = w.view
    assert 0 < view._first < 600 - 2 and "Show earlier messages" in view.toPlainText()
    assert "question 299" in view.toPlainText() and "question 10" not in view.toPlainText()
    first = view._first
    view.anchorClicked.emit(QUrl(EARLIER))
    assert view._first < first and f"question {view._first // 2 + 1}" in view.toPlainText()
    regenerated = click_link(qtbot, view, "regenerate")  # the links still point at the right turns
    assert regenerated == 599
    ok, _ = wait_reply(qtbot, w)
    assert ok and len(w.chat.current.turns) == 600 and w.chat.current.turns[598].content == "question 299"


def test_only_the_open_chat_is_read_at_start_and_the_others_when_chosen(make_window, qtbot, tmp_path):
    store = saved_history(tmp_path)
    older = Conversation("older", "Older", 1.0, 1.0).with_turn(Turn("user", "old question"))
    store.save(replace(older, updated=1.0))
    store.save(Conversation("newer", "Newer").with_turn(Turn("user", "new question")))
    w = make_window(strategy="none", max_new_tokens=6)
    assert w.chat.current_id == "newer" and w.chat.loaded == {"newer"}
    assert w.chat.conversations["older"].turns == ()  # a title only, until it is opened
    w.chat.rename("older", "Older, renamed")
    (kept,) = [c for c in saved_history(tmp_path).load_all()[0] if c.id == "older"]
    assert kept.title == "Older, renamed" and [t.content for t in kept.turns] == ["old question"]
    w.chat.select("older")
    assert "old question" in w.view.toPlainText() and "older" in w.chat.loaded


def test_a_restored_answer_shows_the_figures_its_footer_gave(make_window, qtbot, tmp_path):
    """The dock's acceptance and tokens a step for an answer of an earlier session are its footer's (its totals'),
    not counted again from its token records, which can tell another story (1.27 against the footer's 1.24)."""
    records = (TokenRecord("a", "target", 0), TokenRecord("b", "draft", 1, 0, 0.9, 0.8), TokenRecord("c", "bonus", 1),
               TokenRecord("d", "draft", 2, 0, 0.9, 0.8), TokenRecord("e", "bonus", 2))  # 5 tokens in 3 passes
    footer = "tiny · draft-model · 5 tokens · 40.0 tok/s · acceptance 50% · 1.24 tokens/step · 1.10× vs plain"
    conv = Conversation("restored", "Restored").with_turn(Turn("user", "q")).with_turn(
        Turn("assistant", "abcde", records, footer))
    saved_history(tmp_path).save(conv)
    w = make_window(strategy="none", max_new_tokens=6)
    w.chat.select("restored")
    shown = {key: label.text() for key, label in w.plots.stat_labels.items()}
    assert (shown["acceptance"], shown["per_step"], shown["tps"], shown["speedup"]) == ("50%", "1.24", "40.0", "1.10×")
    assert list(w.plots.series["acceptance"].values())  # the plots still drawn from the records


def test_a_large_chat_is_read_in_the_background_and_takes_messages_once_read(make_window, qtbot, tmp_path,
                                                                               monkeypatch):
    from specula.app.chat import ChatController

    store = saved_history(tmp_path)
    store.save(replace(Conversation("big", "Big").with_turn(Turn("user", "big question")), updated=1.0))
    store.save(Conversation("small", "Small").with_turn(Turn("user", "small question")))
    monkeypatch.setattr(ChatController, "BACKGROUND_TURNS", 0)  # every chat counts as large here
    w = make_window(strategy="none", max_new_tokens=6)
    qtbot.waitUntil(lambda: "small question" in w.view.toPlainText(), timeout=10_000)
    w.chat.select("big")
    assert w.view.toPlainText() == "" and w.view.placeholderText() == "Opening this conversation…"
    assert not w.chat.send("not yet", w.settings)  # nothing is sent into a chat that is not read yet
    w.chat.new_conversation()  # while it opens: a new, empty chat, which invites a message again
    assert w.chat.current_id not in ("big", "small")
    assert w.view.placeholderText() != "Opening this conversation…"
    w.chat.select("big")
    qtbot.waitUntil(lambda: "big question" in w.view.toPlainText(), timeout=10_000)
    assert w.chat.send("now", w.settings)
    ok, _ = wait_reply(qtbot, w)
    assert ok and [t.content for t in saved_history(tmp_path).load("big").turns][:2] == ["big question", "now"]


def test_a_base_model_says_so_and_its_messages_continue_as_plain_text(make_window, qtbot, tiny_session, monkeypatch):
    """A model without a chat template (a GGUF of a base model): one notice, and each message is continued as
    plain text instead of an error."""
    from tests.app.conftest import ChatTokenizer

    monkeypatch.setattr(ChatTokenizer, "chat_template", None)
    w = make_window(max_new_tokens=6)
    tokenizer = tiny_session.target.tokenizer
    assert any("no chat template" in m and "plain text" in m for m in w.notices.messages)
    w.send_text("once upon a time")
    ok, finished = wait_reply(qtbot, w)
    assert ok and len(finished.token_ids) == 6
    assert tokenizer.conversations == []  # the template was never asked for


def test_a_short_conversation_is_drawn_whole_without_a_link_over_a_message_or_two(qapp):
    """Two exchanges with answers of a few hundred tokens said "Show earlier messages (2 more)" over the first
    question: what would be hidden is drawn too where it is less than another page; a long chat still pages."""
    from specula.app.chatview import SHOWN_TOKENS, ChatView

    def chat(exchanges: int, answer_tokens: int) -> list[Turn]:
        turns = []
        for i in range(exchanges):
            tokens = tuple(TokenRecord(f"w{j} ", "target", j, 0) for j in range(answer_tokens))
            turns += [Turn("user", f"question {i}"), Turn("assistant", f"answer {i}", tokens)]
        return turns

    view = ChatView()
    view.show_turns(chat(2, 300))
    assert view._first == 0 and "Show earlier messages" not in view.toPlainText() and "question 0" in view.toPlainText()
    view.show_turns(chat(40, SHOWN_TOKENS))
    assert view._first > 0 and "Show earlier messages" in view.toPlainText()


def test_a_new_message_answer_or_error_is_scrolled_to_after_earlier_messages_were_shown(qtbot):
    """After "Show earlier messages" the chat sat where the user read back, and a message sent, a new answer, an
    error or a notice arrived off screen below: each is scrolled to. A streaming answer still leaves reading alone."""
    from specula.app.chatview import ChatView

    view = ChatView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.show()
    view.show_turns([Turn(role, f"{role} {i} " + "word " * 400) for i in range(40) for role in ("user", "assistant")])
    bar = view.verticalScrollBar()
    at_bottom = lambda: bar.value() == bar.maximum() > 0  # noqa: E731
    assert at_bottom()
    view.show_earlier()
    assert not at_bottom()  # reading back, as asked
    view.add_turn(Turn("error", "The model could not be loaded. Using the bundled model for now."), transient=True)
    assert at_bottom()
    for arrives in (lambda: view.add_turn(Turn("user", "next question")), view.begin_answer):
        bar.setValue(0)
        arrives()
        assert at_bottom()
    bar.setValue(0)
    view.append_tokens([TokenRecord(f"w{j} ", "target", j) for j in range(200)])
    view.flush()
    assert bar.value() == 0
