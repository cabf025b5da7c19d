"""A conversation that outgrows the context window (the tiny model's is 512 tokens; its test tokenizer
makes one token per character): the oldest turns are left out, the window says so, and only a newest
message that is too long on its own shows the engine's error."""

from __future__ import annotations

from dataclasses import replace

from specula.app.fit import drop_oldest
from tests.app.conftest import click_link, saved_history, snap, wait_reply


def test_oldest_turns_are_left_out_to_fit_the_context_window(make_window, qtbot, tmp_path, tiny_session):
    w = make_window(strategy="prompt-lookup", max_new_tokens=10)
    w.settings = replace(w.settings, system_prompt="Be brief.")
    tokenizer = tiny_session.target.tokenizer
    for letter in "ab":
        w.send_text(letter * 200)
        ok, _ = wait_reply(qtbot, w)
        assert ok
    assert "left out" not in w.view.toPlainText()
    w.send_text("c" * 200)  # with the first two exchanges: about 650 tokens
    ok, finished = wait_reply(qtbot, w)
    assert ok and len(finished.token_ids) == 10
    sent = tokenizer.conversations[-1]
    assert sent[0] == {"role": "system", "content": "Be brief."}  # the system prompt stays
    assert [t["role"] for t in sent[1:]] == ["user", "assistant", "user"] and sent[1]["content"] == "b" * 200
    assert sent[-1]["content"] == "c" * 200
    text = w.view.toPlainText()
    assert "Earlier turns were left out to fit the context window" in text and "2 earlier messages" in text
    answer = w.chat.current.turns[-1]
    assert answer.role == "assistant" and "left out" in answer.note
    # the conversation keeps every turn; only the request was shortened
    assert [t.role for t in w.chat.current.turns] == ["user", "assistant"] * 3
    found, _ = saved_history(tmp_path).load_all()
    assert "left out" in found[0].turns[-1].note
    snap(w, "context")


def test_a_newest_message_too_long_on_its_own_shows_the_engine_error(make_window, qtbot, tiny_session):
    w = make_window(strategy="none", max_new_tokens=10)
    w.send_text("a short question")
    wait_reply(qtbot, w)
    tokenizer = tiny_session.target.tokenizer
    before = len(tokenizer.conversations)
    w.send_text("x" * 600)
    ok, failed = wait_reply(qtbot, w)
    assert not ok and failed.kind == "ContextTooLongError" and "context window" in failed.message
    tried = tokenizer.conversations[before:]
    assert [len(c) for c in tried] == [3, 1]  # everything, then the newest message alone
    assert "Error" in w.view.toPlainText() and w.state == "ready"
    assert [t.role for t in w.chat.current.turns] == ["user", "assistant", "user", "error"]
    assert "Retry" in w.view.toPlainText().splitlines()[-1]
    # Retry sends the failed message again (it fails the same way); a new message takes the link away
    click_link(qtbot, w.view, "retry")
    ok, _ = wait_reply(qtbot, w)
    assert not ok and [t.role for t in w.chat.current.turns] == ["user", "assistant", "user", "error"]
    w.send_text("hi")
    ok, _ = wait_reply(qtbot, w)
    assert ok and "Retry" not in w.view.toPlainText()
    text = w.view.toPlainText()
    assert text.index("context window") < text.index("hi\nEdit")  # the error bubble lost only its link row


def test_drop_oldest_keeps_the_system_prompt_and_starts_with_a_user_turn():
    from specula.engine.api.prompts import Message

    s, u1, a1, u2, a2, u3 = (Message("system", "s"), Message("user", "1"), Message("assistant", "1"),
                             Message("user", "2"), Message("assistant", "2"), Message("user", "3"))
    assert drop_oldest((s, u1, a1, u2, a2, u3)) == (s, u2, a2, u3)
    assert drop_oldest((s, u2, a2, u3)) == (s, u3)
    assert drop_oldest((s, u3)) is None and drop_oldest((u3,)) is None
    assert drop_oldest((a1, u2, a2, u3)) == (u2, a2, u3)


def test_a_message_larger_than_the_engine_takes_is_refused_in_the_window_and_the_chat_goes_on(
        make_window, qtbot, monkeypatch):
    """A message over the engine's body limit (4 MB) broke every later send of its chat with an error naming
    `--max-body-mb`, which a window's user cannot set: it is refused before it is sent, in one line, the text kept
    to be shortened, and the chat takes the next message."""
    from PySide6.QtCore import Qt

    from specula.app import fit
    from specula.engine.serving.guard import MAX_BODY_BYTES

    assert fit.BODY_LIMIT == MAX_BODY_BYTES and fit.too_long("x" * 10_000) is None
    refused = fit.too_long("é" * (fit.MESSAGE_LIMIT // 6 + 1))  # 6 bytes a character as sent
    assert refused and "too long to send" in refused and "\n" not in refused
    monkeypatch.setattr(fit, "MESSAGE_LIMIT", 200)  # a small limit: the same code, a quick test
    w = make_window(strategy="none", max_new_tokens=4)
    w.send_text("a short question")
    assert wait_reply(qtbot, w)[0]
    turns = w.chat.current.turns
    w.composer.input.setPlainText("y" * 300)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    assert w.chat.reply is None and w.chat.current.turns == turns  # not sent, not kept
    assert w.composer.input.toPlainText() == "y" * 300 and w.composer.refusal.isVisibleTo(w)
    assert "too long to send" in w.composer.refusal.text()
    assert not w.send_text("z" * 300)  # and past the composer (a script), refused the same way
    assert w.chat.current.turns == turns and "too long to send" in w.view.toPlainText()
    w.composer.input.setPlainText("a shorter one")
    assert not w.composer.refusal.isVisibleTo(w)
    qtbot.keyClick(w.composer.input, Qt.Key.Key_Return)
    ok, _ = wait_reply(qtbot, w)
    assert ok and [t.role for t in w.chat.current.turns] == ["user", "assistant"] * 2


def test_earlier_messages_too_large_to_send_together_are_left_out(make_window, qtbot, monkeypatch, tiny_session):
    """Messages each within the limit but larger together: the oldest are left out of the request, as for the
    context window, so that the chat goes on."""
    from specula.app import fit
    from specula.app.chat import body_size, build_request
    from specula.app.history import Turn, chat_messages

    w = make_window(strategy="none", max_new_tokens=4)
    w.send_text("a" * 150)
    assert wait_reply(qtbot, w)[0]
    everything = chat_messages(w.chat.current.with_turn(Turn("user", "next")))
    monkeypatch.setattr(fit, "BODY_LIMIT", body_size(build_request(everything, w.settings)) - 100)
    w.send_text("next")
    ok, _ = wait_reply(qtbot, w)
    assert ok and tiny_session.target.tokenizer.conversations[-1] == [{"role": "user", "content": "next"}]
    assert "left out" in w.chat.current.turns[-1].note
    assert [t.role for t in w.chat.current.turns] == ["user", "assistant"] * 2  # the chat keeps every turn


def test_fit_body_leaves_out_the_oldest_exchanges_until_the_body_fits(monkeypatch):
    from specula.app import fit
    from specula.engine.api.prompts import Message

    s, u1, a1 = Message("system", "s"), Message("user", "1" * 1000), Message("assistant", "one")
    u2 = Message("user", "2")
    monkeypatch.setattr(fit, "BODY_LIMIT", 500)
    assert fit.fit_body((s, u1, a1, u2), 1100) == (s, u2)  # the system prompt and the newest message stay
    assert fit.fit_body((s, u1, a1, u2), 400) == (s, u1, a1, u2)
    assert fit.fit_body((s, u1), 5000) == (s, u1)  # nothing left to leave out: the engine's error will say
    assert fit.sent_size("é") == len('"\\u00e9"')
