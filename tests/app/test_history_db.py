"""Conversations in SQLite: saves append, answers cut by a crash are kept and marked, the JSON files of
earlier versions are imported once, search, and failures that say where."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from specula.app.history import Conversation, TokenRecord, Turn, chat_messages, to_markdown
from specula.app.history_db import ConversationDB, StoreError


def answer(text: str) -> Turn:
    return Turn("assistant", text, tuple(TokenRecord(w + " ", "draft", 1, 0, 0.9, 0.8) for w in text.split()), "2 tokens")


def test_conversations_come_back_as_saved_newest_first(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    older = Conversation("a", "Older", 1.0, 1.0).with_turn(Turn("user", "hi")).with_turn(answer("hello there"))
    newer = Conversation("b", "Newer").with_turn(Turn("user", "more"))
    db.save(older)
    db.save(newer)
    db.close()
    found, notices = ConversationDB(tmp_path / "c.db").load_all()
    assert [c.id for c in found] == ["b", "a"] and notices == []
    assert found[1].turns == older.turns and found[1].title == "Older"


def test_a_save_writes_only_the_new_turns(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    conv = Conversation("big")
    for i in range(500):
        conv = conv.with_turn(Turn("user", f"question {i}")).with_turn(answer(f"answer number {i}"))
    db.save(conv)
    connection = db._connect()
    before = connection.total_changes
    db.save(conv.with_turn(Turn("user", "one more")))
    assert connection.total_changes - before <= 20  # the conversation's row, one turn, its search index rows
    before = connection.total_changes
    db.save(conv.truncated(999).with_turn(answer("again")))  # regenerate the last answer
    assert connection.total_changes - before <= 40  # not the 1,000 turns
    found, _ = ConversationDB(tmp_path / "c.db").load_all()
    assert len(found[0].turns) == 1000 and found[0].turns[-1].content == "again"


def test_an_answer_cut_by_a_crash_is_kept_marked_and_left_out_of_later_prompts(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    conv = Conversation("c").with_turn(Turn("user", "first")).with_turn(answer("one")).with_turn(Turn("user", "tell me"))
    db.save(conv)
    db.begin_answer(conv)
    db.update_answer(conv, "Once upon a")
    db.close()  # the app dies here
    found, notices = ConversationDB(tmp_path / "c.db").load_all()
    turns = found[0].turns
    assert turns[-1].interrupted and turns[-1].content == "Once upon a" and "Interrupted" in turns[-1].note
    assert any("interrupted" in n for n in notices)
    later = found[0].with_turn(Turn("user", "something else"))
    assert [m.content for m in chat_messages(later)] == ["first", "one", "something else"]
    assert "**Assistant (interrupted)**" in to_markdown(later)
    _, notices = ConversationDB(tmp_path / "c.db").load_all()
    assert notices == []  # marked once


def test_json_conversations_of_earlier_versions_are_imported_once_and_kept(tmp_path):
    folder = tmp_path / "conversations"
    folder.mkdir()
    conv = Conversation("old", "From before").with_turn(Turn("user", "hi")).with_turn(answer("hello"))
    (folder / "old.json").write_text(json.dumps(conv.to_dict()))
    (folder / "broken.json").write_text("{not json")
    found, notices = ConversationDB(tmp_path / "c.db", folder).load_all()
    assert [c.turns for c in found] == [conv.turns]
    assert any("1 conversations were imported" in n for n in notices) and any("broken.json" in n for n in notices)
    assert (folder / "old.json").exists()
    found, notices = ConversationDB(tmp_path / "c.db", folder).load_all()
    assert len(found) == 1 and notices == []


def test_json_nested_too_deeply_to_read_is_skipped_not_fatal(tmp_path):
    """Python's JSON reader raises RecursionError past about a thousand levels: a conversation file of an earlier
    version is then named and skipped, and a turn's token records are dropped (the turn shows as plain text)."""
    folder = tmp_path / "conversations"
    folder.mkdir()
    (folder / "deep.json").write_text('{"id": ' * 50000 + "1" + "}" * 50000)
    (folder / "versions.json").write_text('{"id": "v", "turns": [' + '{"role": "assistant", "content": "a", '
                                          '"versions": [' * 2000 + "]}" * 2000 + "]}")
    db = ConversationDB(tmp_path / "c.db", folder)
    found, notices = db.load_all()
    assert found == [] and any("deep.json, versions.json" in n for n in notices)
    db.save(Conversation("a").with_turn(answer("kept text")))
    raw = sqlite3.connect(tmp_path / "c.db")
    raw.execute("UPDATE turns SET tokens = ?, versions = ?", ("[" * 50000 + "]" * 50000, "[" * 50000 + "]" * 50000))
    raw.commit()
    raw.close()
    (turn,) = ConversationDB(tmp_path / "c.db").load("a").turns
    assert (turn.content, turn.tokens, turn.versions) == ("kept text", (), ())


def test_search_finds_words_in_every_conversation_and_takes_any_text(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    db.save(Conversation("a").with_turn(Turn("user", "How do I rename a variable in Python?")))
    db.save(Conversation("b").with_turn(Turn("user", "hello")).with_turn(answer("Renaming: use your editor's rename")))
    assert {c for c, _, _ in db.search("rename")} == {"a", "b"}
    hits = db.search("python variable")
    assert [(c, i) for c, i, _ in hits] == [("a", 0)] and "[variable]" in hits[0][2]
    assert db.search('"unbalanced AND ( NEAR') == [] and db.search("   ") == []


def test_a_write_that_fails_says_where_and_changes_nothing(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    conv = Conversation("a").with_turn(Turn("user", "hi"))
    db.save(conv)
    other = sqlite3.connect(tmp_path / "c.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the database
    with pytest.raises(StoreError, match="c.db"):
        db.save(conv.with_turn(answer("hello")))
    other.execute("ROLLBACK")
    db.save(conv.with_turn(answer("hello")))  # the retry writes the turn it could not write before
    found, _ = ConversationDB(tmp_path / "c.db").load_all()
    assert [t.content for t in found[0].turns] == ["hi", "hello"]


def test_every_save_before_a_kill_is_there(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.getcwd()!r})
        from specula.app.history import Conversation, Turn
        from specula.app.history_db import ConversationDB
        db = ConversationDB({str(tmp_path / "c.db")!r})
        conv = Conversation("k")
        for i in range(40):
            conv = conv.with_turn(Turn("user", f"message {{i}}"))
            db.save(conv)
            print(i, flush=True)
            if i == 25:
                db.begin_answer(conv)
                db.update_answer(conv, "partial")
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL
    printed = run.stdout.split()
    found, _ = ConversationDB(tmp_path / "c.db").load_all()
    contents = [t.content for t in found[0].turns]
    assert contents[: len(printed)] == [f"message {i}" for i in range(len(printed))] and len(printed) == 26
    assert found[0].turns[-1].interrupted and found[0].turns[-1].content == "partial"


def test_an_answer_begun_twice_then_saved_is_saved_once(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    conv = Conversation("r").with_turn(Turn("user", "too long at first"))
    db.save(conv)
    db.begin_answer(conv)  # the first try failed (the prompt did not fit) and was sent again shorter
    db.update_answer(conv, "par")
    db.begin_answer(conv)
    db.update_answer(conv, "partial")
    db.save(conv.with_turn(answer("the whole answer")))
    found, notices = ConversationDB(tmp_path / "c.db").load_all()
    assert [t.content for t in found[0].turns] == ["too long at first", "the whole answer"] and notices == []
    assert [c for c, _, _ in db.search("whole")] == ["r"] and db.search("partial") == []
    db.delete("r")
    assert db.search("whole") == [] and ConversationDB(tmp_path / "c.db").load_all()[0] == []


def test_listing_reads_no_turns_and_a_save_from_another_run_never_drops_turns(tmp_path):
    db = ConversationDB(tmp_path / "c.db")
    conv = Conversation("a", "A").with_turn(Turn("user", "one")).with_turn(answer("two"))
    db.save(conv)
    other = ConversationDB(tmp_path / "c.db")  # another run: it has not read this conversation
    (listed,), _ = other.list_all()
    assert listed.title == "A" and listed.turns == ()
    other.rename("a", "Renamed")
    other.save(conv.with_turn(Turn("user", "three")))  # appended to what the database holds
    found = ConversationDB(tmp_path / "c.db").load("a")
    assert [t.content for t in found.turns] == ["one", "two", "three"] and found.title == "A"


def test_rows_another_program_wrote_are_read_as_far_as_they_make_sense(tmp_path):
    path = tmp_path / "c.db"
    store = ConversationDB(path)
    good = tuple(TokenRecord("hi", "draft", 1, 0) for _ in range(2))
    store.save(Conversation("a", "Chat", 1.0, 2.0, (Turn("user", "q"), Turn("assistant", "hi hi", good))))
    store.close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE conversations SET title = ?, updated = 'soon' WHERE id = 'a'", (b"Bytes \xff title",))
    raw.execute("UPDATE turns SET tokens = '{garbage' WHERE idx = 1")
    raw.commit()
    raw.close()
    (conv,), notices = ConversationDB(path).load_all()
    assert conv.title == "Bytes \ufffd title" and conv.updated == 0.0
    assert [t.content for t in conv.turns] == ["q", "hi hi"] and conv.turns[1].tokens == ()  # shown as plain text


def test_a_database_of_another_program_is_set_aside_not_taken_for_ours(tmp_path):
    path = tmp_path / "conversations.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE conversations (x INT)")
    raw.execute("INSERT INTO conversations VALUES (7)")
    raw.commit()
    raw.close()
    store = ConversationDB(path)
    found, notices = store.load_all()
    assert found == [] and len(notices) == 1 and "not a conversations database" in notices[0]
    store.save(Conversation("b", "New", turns=(Turn("user", "kept"),)))
    assert ConversationDB(path).load("b").turns[0].content == "kept"
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("conversations") and p != path
             and not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and sqlite3.connect(aside[0]).execute("SELECT x FROM conversations").fetchone() == (7,)


def test_an_answers_versions_are_kept_with_the_one_shown(tmp_path):
    first, second = Turn("assistant", "first answer"), Turn("assistant", "second answer", (TokenRecord("x", "draft"),))
    third = Turn("assistant", "third").replacing(second.replacing(first))
    assert [v.content for v in third.all_versions] == ["first answer", "second answer", "third"]
    shown = third.showing(1)
    assert shown.content == "second answer" and shown.version == 1 and shown.tokens == second.tokens
    assert [v.content for v in shown.all_versions] == ["first answer", "second answer", "third"]
    conv = Conversation("v", "Versions", turns=(Turn("user", "q"), shown))
    store = ConversationDB(tmp_path / "c.db")
    store.save(conv)
    back = ConversationDB(tmp_path / "c.db").load("v")
    assert back.turns == conv.turns and back.turns[1].version == 1
    assert [m.content for m in chat_messages(back)] == ["q", "second answer"]  # the shown one is sent
    assert Turn.from_dict(shown.to_dict()) == shown
    store.save(conv.truncated(1).with_turn(shown.showing(0)))  # switching writes the turn again
    assert ConversationDB(tmp_path / "c.db").load("v").turns[1].content == "first answer"


def test_a_database_without_the_versions_column_gains_it(tmp_path):
    path = tmp_path / "c.db"
    ConversationDB(path).save(Conversation("a", "Old", turns=(Turn("user", "hi"),)))
    raw = sqlite3.connect(path)
    raw.execute("ALTER TABLE turns DROP COLUMN versions")  # as a database of the previous release
    raw.commit()
    raw.close()
    store = ConversationDB(path)
    assert store.load("a").turns == (Turn("user", "hi"),)
    store.save(store.load("a").with_turn(Turn("assistant", "b").replacing(Turn("assistant", "a"))))
    assert ConversationDB(path).load("a").turns[1].versions == (Turn("assistant", "a"),)


def test_a_gap_in_a_conversations_turns_never_costs_a_stored_answer(tmp_path):
    """Turns 0 and 7 (a damaged or hand-edited database): a save after a new turn keeps the stored answer (it
    deleted every turn from the first changed position on, the answer among them), and so does an answer begun."""
    path = tmp_path / "c.db"
    db = ConversationDB(path)
    db.save(Conversation("g", "Gap").with_turn(Turn("user", "first question")).with_turn(answer("the stored answer")))
    db.close()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE turns SET idx = 7 WHERE conversation = 'g' AND idx = 1")
    raw.commit()
    raw.close()
    db = ConversationDB(path)
    (conv,), _ = db.load_all()
    assert [t.content for t in conv.turns] == ["first question", "the stored answer"]
    conv = conv.with_turn(Turn("user", "second question"))
    db.begin_answer(conv)
    db.save(conv.with_turn(answer("a new answer")))
    db.close()
    (again,), _ = ConversationDB(path).load_all()
    assert [t.content for t in again.turns] == ["first question", "the stored answer", "second question", "a new answer"]
    assert ConversationDB(path).search("stored") == [("g", 1, "the [stored] answer")]  # the search follows the turn


def _three_chats(path):
    db = ConversationDB(path)
    for i in range(3):
        db.save(Conversation(f"c{i}", f"Chat {i}").with_turn(Turn("user", f"question {i} " * 40))
                .with_turn(answer(f"answer {i} " * 40)))
    db.close()


def test_a_damaged_search_index_is_salvaged_with_every_conversation_and_saves_work_again(tmp_path):
    """The search index's tables damaged ("vtable constructor failed: turns_text" on every save, for ever, and
    new answers lost on exit): the database is moved aside and a new one keeps every conversation, searchable."""
    path = tmp_path / "conversations.db"
    _three_chats(path)
    raw = sqlite3.connect(path)
    raw.execute("DROP TABLE turns_text_config")
    raw.commit()
    raw.close()
    db = ConversationDB(path)
    found, notices = db.load_all()
    assert sorted(c.id for c in found) == ["c0", "c1", "c2"] and all(len(c.turns) == 2 for c in found)
    assert len(notices) == 1 and "damaged" in notices[0] and "all conversations were kept" in notices[0]
    assert len(list(tmp_path.glob("conversations.db.corrupt-*"))) == 1
    db.save(Conversation("new").with_turn(Turn("user", "a fresh question")))
    assert {c for c, _, _ in db.search("fresh")} == {"new"} and {c for c, _, _ in db.search("answer")} == {"c0", "c1", "c2"}


@pytest.mark.parametrize("table", ["turns_text_idx", "turns_text_content", "turns_text_docsize"])
def test_a_search_index_that_lost_a_table_is_salvaged_when_opened(tmp_path, table):
    """A table of the search index dropped (every save failed with "SQL logic error", for ever; without its content
    table the folder was called unwritable): found when the database opens, and salvaged with every conversation."""
    path = tmp_path / "conversations.db"
    _three_chats(path)
    raw = sqlite3.connect(path)
    raw.execute(f"DROP TABLE {table}")
    raw.commit()
    raw.close()
    db = ConversationDB(path)
    found, notices = db.list_all()
    assert sorted(c.id for c in found) == ["c0", "c1", "c2"] and not db.read_only
    assert len(notices) == 1 and f"its table '{table}' is missing" in notices[0] and "all conversations were kept" in notices[0]
    db.save(db.load("c1").with_turn(Turn("user", "a fresh question")))
    assert {c for c, _, _ in db.search("fresh")} == {"c1"} and {c for c, _, _ in db.search("answer")} == {"c0", "c1", "c2"}
    assert len(list(tmp_path.glob("conversations.db.corrupt-*"))) == 1


def test_a_search_index_table_lost_while_the_app_runs_is_salvaged_by_the_save(tmp_path):
    path = tmp_path / "conversations.db"
    _three_chats(path)
    db = ConversationDB(path)
    conv = db.load("c1").with_turn(Turn("user", "one more"))
    raw = sqlite3.connect(path)
    raw.execute("DROP TABLE turns_text_idx")
    raw.commit()
    raw.close()
    db.save(conv)  # once "SQL logic error", hidden behind "cannot rollback - no transaction is active"
    (notice,) = db.take_notices()
    assert "its table 'turns_text_idx' is missing" in notice and "all conversations were kept" in notice
    again = {c.id: len(c.turns) for c in ConversationDB(path).load_all()[0]}
    assert again == {"c0": 2, "c1": 3, "c2": 2}


def test_a_write_that_sqlite_rolled_back_itself_says_why_it_failed(tmp_path):
    """SQLite ends the transaction itself after some errors: the error is reported, not the ROLLBACK's own."""
    db = ConversationDB(tmp_path / "c.db")
    db.save(Conversation("a").with_turn(Turn("user", "hi")))

    def failing(connection):
        connection.execute("ROLLBACK")  # as SQLite does after a disk full or an I/O error
        raise sqlite3.OperationalError("disk I/O error")

    with pytest.raises(StoreError, match="disk I/O error"):
        db._write("the test", failing)
    db.save(Conversation("b").with_turn(Turn("user", "still saves")))
    assert sorted(c.id for c in ConversationDB(tmp_path / "c.db").list_all()[0]) == ["a", "b"]


def test_a_damaged_page_found_by_a_save_is_salvaged_and_the_save_made(tmp_path, monkeypatch):
    """A save that meets a damaged page ("database disk image is malformed") moves the database aside, keeps every
    conversation still readable in a new one, and makes the save there: the new answer is not lost."""
    import specula.app.history_db as history_db

    path = tmp_path / "conversations.db"
    _three_chats(path)
    db = ConversationDB(path)
    found, _ = db.load_all()
    real = history_db._insert_turns
    calls = []

    def malformed_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.DatabaseError("database disk image is malformed")
        return real(*args, **kwargs)

    monkeypatch.setattr(history_db, "_insert_turns", malformed_once)
    conv = next(c for c in found if c.id == "c1").with_turn(Turn("user", "one more")).with_turn(answer("kept"))
    db.save(conv)
    assert len(calls) == 2 and len(list(tmp_path.glob("conversations.db.corrupt-*"))) == 1
    (notice,) = db.take_notices()  # for the window to show now, not at the next start
    assert "was damaged (database disk image is malformed)" in notice and "all conversations were kept" in notice
    assert db.take_notices() == []
    again, notices = ConversationDB(path).load_all()
    assert {c.id: len(c.turns) for c in again} == {"c0": 2, "c1": 4, "c2": 2}
    assert [t.content for t in next(c for c in again if c.id == "c1").turns][-1] == "kept"


def test_a_database_that_cannot_be_written_here_is_shown_read_only(tmp_path, monkeypatch):
    """A read-only data folder (the file or the folder; root ignores permissions, so opening it for writing fails
    here as it does there): the chats are listed and open, with a notice; a save says why it fails, and works
    once the database can be written again."""
    path = tmp_path / "conversations.db"
    _three_chats(path)
    real = ConversationDB._open

    def read_only_folder(self):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(ConversationDB, "_open", read_only_folder)
    db = ConversationDB(path)
    found, notices = db.list_all()
    assert sorted(c.id for c in found) == ["c0", "c1", "c2"] and db.read_only
    assert len(notices) == 1 and "cannot be written here" in notices[0] and "chats are shown" in notices[0]
    assert len(db.load("c1").turns) == 2 and {c for c, _, _ in db.search("answer")} == {"c0", "c1", "c2"}
    more = db.load("c1").with_turn(Turn("user", "later"))
    with pytest.raises(StoreError, match="cannot be written here"):
        db.save(more)
    monkeypatch.setattr(ConversationDB, "_open", real)  # writable again
    db.save(more)
    assert not db.read_only and len(ConversationDB(path).load("c1").turns) == 3
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setattr(ConversationDB, "_open", read_only_folder)
    with pytest.raises(StoreError, match="cannot open"):  # nothing to show: the error as before
        ConversationDB(tmp_path / "elsewhere" / "conversations.db").list_all()
