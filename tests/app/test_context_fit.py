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
