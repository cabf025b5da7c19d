"""What the drafters keep of the model's answers, from the window's side: a deleted chat's answers leave the
corpora (a new epoch in the history, their files gone), and the Settings say what is kept and clear it."""

from __future__ import annotations

from specula.app.history import Conversation, Turn
from specula.app.history_db import ConversationDB
from specula.engine.drafters.answer_history import earlier_answers, history_state


def chat(cid: str, answer: str) -> Conversation:
    return Conversation(cid, turns=(Turn("user", "A line, please."), Turn("assistant", answer)))


def test_deleting_a_chat_starts_a_new_epoch_and_removes_the_corpus_files(tmp_path):
    db = ConversationDB(tmp_path / "conversations.db")
    db.save(chat("a", "the first answer"))
    db.save(chat("b", "the second answer"))
    db.corpus_folder.mkdir()
    (db.corpus_folder / "model.npz").write_bytes(b"the first answer, as tokens")
    assert db.corpus_size() == (1, 27)
    assert history_state(db.path).epoch == 0
    db.delete("a")
    assert history_state(db.path).epoch == 1 and db.corpus_size() == (0, 0)
    assert earlier_answers(db.path) == ["the second answer"]
    db.clear_corpus()  # the chats stay; the corpora read none of their answers
    state = history_state(db.path)
    assert state.epoch == 2 and earlier_answers(db.path, since=state.since) == []
    assert [c.id for c in db.load_all()[0]] == ["b"]
    db.save(chat("c", "an answer after the clearing"))
    assert earlier_answers(db.path, since=state.since) == ["an answer after the clearing"]
    db.close()


def test_the_settings_say_what_is_kept_and_clear_it(qtbot, tmp_path):
    from specula.app.settings import Settings
    from specula.app.settings_dialog import SettingsDialog

    db = ConversationDB(tmp_path / "conversations.db")
    db.save(chat("a", "an answer"))
    db.corpus_folder.mkdir()
    (db.corpus_folder / "model.npz").write_bytes(b"x" * 250_000)
    dialog = SettingsDialog(Settings(), history=db)
    qtbot.addWidget(dialog)
    text = dialog.corpus.text.text()
    assert str(db.corpus_folder) in text and "1 model, 0.2 MB" in text and "deleted chat" in text
    dialog.corpus.button.click()
    assert "Cleared" in dialog.corpus.done.text() and not dialog.corpus.button.isEnabled()
    assert db.corpus_size() == (0, 0) and history_state(db.path).epoch == 1
    assert SettingsDialog(Settings()).corpus is None  # no history: nothing to say
    db.close()
