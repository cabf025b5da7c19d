"""Conversations whose stored values are out of range or damaged: dates that are no date, an earlier version's file
with one bad field, a search index that lost or garbled its contents, a newer version's database, a kill between a
message and its answer."""

from __future__ import annotations

import json
import sqlite3

import pytest

from specula.app.history import Conversation, Turn
from specula.app.history_db import ConversationDB, StoreError

BAD_DATES = [1e300, float("inf"), float("-inf"), -1e12, 3e11, "NaN", "soon", 10**400]


def _chat(cid: str, text: str, updated: float = 1_700_000_000.0) -> Conversation:
    return Conversation(cid, f"Chat {cid}", updated, updated).with_turn(Turn("user", text))


def _set_dates(path, dates: dict) -> None:
    raw = sqlite3.connect(path)
    for cid, when in dates.items():
        raw.execute("UPDATE conversations SET updated = ?, created = ? WHERE id = ?",
                    (str(when) if isinstance(when, int) else when, when if isinstance(when, str) else 0, cid))
    raw.commit()
    raw.close()


def test_dates_that_are_no_date_are_unknown_and_the_chat_list_shows_every_chat(qtbot, tmp_path):
    """A date of 1e300, Inf, -1e12 or 3e11 (milliseconds) in the database raised OverflowError or ValueError in the
    chat list at every start: such a date is unknown, listed after the dated chats and shown without a date."""
    from specula.app.sidebar import WHEN_ROLE, ConversationList, when_text

    path = tmp_path / "c.db"
    db = ConversationDB(path)
    for i, _ in enumerate(BAD_DATES):
        db.save(_chat(f"bad{i}", f"question {i}"))
    db.save(_chat("good", "a dated chat", 1_600_000_000.0))
    db.close()
    _set_dates(path, {f"bad{i}": when for i, when in enumerate(BAD_DATES)})
    found, notices = ConversationDB(path).list_all()
    assert found[0].id == "good" and len(found) == len(BAD_DATES) + 1 and notices == []
    assert all(c.updated == 0.0 for c in found[1:])
    sidebar = ConversationList()
    qtbot.addWidget(sidebar)
    sidebar.show_conversations(found, "good")
    whens = [sidebar.list.item(row).data(WHEN_ROLE) for row in range(sidebar.list.count())]
    assert whens[0] != "" and whens[1:] == [""] * len(BAD_DATES)
    assert "Last message: unknown" in sidebar.list.item(1).toolTip()
    for when in (1e20, 3e11, -1e12):  # the list's own guard, whatever reaches it
        assert when_text(when) == "" and when_text(when, now=1e20) == ""
    sidebar.show_conversations([Conversation("x", "X", 1e300, 1e300)], "x")
    assert sidebar.list.item(0).data(WHEN_ROLE) == ""


@pytest.mark.parametrize("updated", ["NaN", 1e20, float("nan"), "soon", None])
def test_an_earlier_versions_file_with_a_damaged_date_is_imported_with_the_others(tmp_path, updated):
    """`"updated": "NaN"` failed the whole import (a NOT NULL column) at every start, the earlier chats hidden and
    a banner saying that new chats were kept in memory: the chat is imported dated by its file, the others too."""
    folder = tmp_path / "conversations"
    folder.mkdir()
    good = _chat("good", "kept as it was")
    (folder / "good.json").write_text(json.dumps(good.to_dict()))
    damaged = {**_chat("damaged", "one bad field").to_dict(), "updated": updated, "created": "yesterday"}
    (folder / "damaged.json").write_text(json.dumps(damaged))
    db = ConversationDB(tmp_path / "c.db", folder)
    found, notices = db.list_all()
    assert notices == [f"2 conversations were imported from {folder} (the files are kept)."]
    dated = {c.id: c.updated for c in found}
    assert dated["good"] == good.updated
    assert dated["damaged"] == pytest.approx((folder / "damaged.json").stat().st_mtime)
    assert db.load("damaged").turns == (Turn("user", "one bad field"),)


def test_an_import_that_cannot_be_written_lists_the_chats_and_says_it_is_tried_again(tmp_path, monkeypatch):
    folder = tmp_path / "conversations"
    folder.mkdir()
    (folder / "old.json").write_text(json.dumps(_chat("old", "from before").to_dict()))
    path = tmp_path / "c.db"
    ConversationDB(path, tmp_path / "none").save(_chat("new", "kept"))
    raw = sqlite3.connect(path)
    raw.execute("DELETE FROM meta WHERE key = 'imported_json'")  # as if the folder appeared after the first start
    raw.commit()
    raw.close()
    real = ConversationDB._write

    def refuse_import(self, what, statements, again=True):
        if what == "the imported conversations":
            raise StoreError(f"could not save {what} to {self.path}: disk full")
        return real(self, what, statements, again)

    monkeypatch.setattr(ConversationDB, "_write", refuse_import)
    found, notices = ConversationDB(path, folder).list_all()
    assert [c.id for c in found] == ["new"]
    assert len(notices) == 1 and "disk full" in notices[0] and "tried again at the next start" in notices[0]
    assert "kept in memory" not in notices[0]
    monkeypatch.setattr(ConversationDB, "_write", real)
    found, _ = ConversationDB(path, folder).list_all()
    assert sorted(c.id for c in found) == ["new", "old"]


def _searchable(path, n: int = 30) -> None:
    db = ConversationDB(path)
    for i in range(n):
        db.save(_chat(f"c{i}", f"hello world number{i} " + "lorem ipsum " * 50))
    db.close()


def test_a_search_index_dropped_and_made_again_empty_is_rebuilt_from_the_chats(tmp_path):
    """The index's table dropped: the next open made it again, empty, and no earlier chat was ever found."""
    path = tmp_path / "c.db"
    _searchable(path, 3)
    raw = sqlite3.connect(path)
    raw.execute("DROP TABLE turns_text")
    raw.commit()
    raw.close()
    db = ConversationDB(path)
    assert len(db.list_all()[0]) == 3
    assert {c for c, _, _ in db.search("lorem")} == {"c0", "c1", "c2"}
    (hit,) = db.search("number1")
    assert hit[:2] == ("c1", 0) and hit[2].startswith("hello world [number1] lorem")
    db.save(_chat("c3", "a newer lorem"))  # and the index follows the saves again
    assert {c for c, _, _ in db.search("lorem")} == {"c0", "c1", "c2", "c3"}


def _garble_index(path) -> None:
    import random

    raw = sqlite3.connect(path)
    rnd = random.Random(1)
    for block_id, block in raw.execute("SELECT id, block FROM turns_text_data WHERE id > 10").fetchall():
        garbled = bytearray(block)
        for k in range(0, len(garbled), 7):
            garbled[k] = rnd.randrange(256)
        raw.execute("UPDATE turns_text_data SET block = ? WHERE id = ?", (bytes(garbled), block_id))
    raw.commit()
    with pytest.raises(sqlite3.DatabaseError):
        raw.execute("INSERT INTO turns_text (turns_text) VALUES ('integrity-check')")
    raw.close()


def test_garbled_search_index_blocks_are_found_and_the_index_rebuilt(tmp_path):
    """Garbled blocks of the index: searches found nothing or failed with "malformed", unnoticed. The index is
    checked before a run's first search and rebuilt when FTS5's integrity check fails, and so it is when a later
    search finds it damaged."""
    path = tmp_path / "c.db"
    _searchable(path)
    _garble_index(path)
    db = ConversationDB(path)
    assert db.index_damaged()
    assert {c for c, _, _ in db.search("hello")} == {f"c{i}" for i in range(30)}
    assert [c for c, _, _ in db.search("number3")] == ["c3"] and not db.index_damaged()
    assert len(db.list_all()[0]) == 30 and not list(tmp_path.glob("*.corrupt-*"))  # nothing set aside
    _garble_index(path)  # while the app runs, after its first search
    assert [c for c, _, _ in db.search("number3")] == ["c3"] and not db.index_damaged()


def test_a_message_is_saved_with_its_answers_first_row_so_a_kill_between_leaves_the_mark(tmp_path):
    """The user's message was committed before the answer's row: a kill between the two left a message with no
    answer and nothing said. Both are one write: the next start marks the answer interrupted."""
    path = tmp_path / "c.db"
    db = ConversationDB(path)
    conv = _chat("k", "first").with_turn(Turn("assistant", "one"))
    db.save(conv)
    asked = conv.with_turn(Turn("user", "tell me more"))
    raw = sqlite3.connect(path)
    roles = []
    real = db._write

    def each_write(what, statements, again=True):
        real(what, statements, again)
        roles.append([r for (r,) in raw.execute("SELECT role FROM turns WHERE conversation = 'k' ORDER BY idx")])

    db._write = each_write
    db.begin_answer(asked)  # no save of the message before it
    db.close()  # the app dies here
    raw.close()
    assert roles == [["user", "assistant", "user", "assistant"]]
    found, notices = ConversationDB(path).load_all()
    assert [t.content for t in found[0].turns] == ["first", "one", "tell me more", ""]
    assert found[0].turns[-1].interrupted and any("interrupted" in n for n in notices)


def test_the_window_saves_a_message_only_with_its_answers_row(make_window, qtbot, tmp_path):
    from specula.app.history_db import STREAMING
    from tests.app.conftest import wait_reply

    w = make_window(strategy="none", max_new_tokens=4)
    store, seen = w.chat.store, []
    real = store._write

    def each_write(what, statements, again=True):
        real(what, statements, again)
        rows = store._connect().execute("SELECT role, state FROM turns WHERE conversation = ? ORDER BY idx",
                                        (w.chat.current_id,)).fetchall()
        seen.append(rows)

    store._write = each_write
    for text in ("first question", "second question"):
        assert w.send_text(text)
        wait_reply(qtbot, w)
    assert w.chat.regenerate(w.settings)
    wait_reply(qtbot, w)
    assert seen and all(rows and rows[-1][0] == "assistant" for rows in seen)  # never a message without its answer
    assert sum(rows[-1][1] == STREAMING for rows in seen) >= 3  # each answer began with a row of its own


def test_a_newer_versions_database_is_read_and_never_written(tmp_path):
    """A database of schema 99 was written to without a word: it is opened to read, with a one-line notice that
    new chats are kept in memory, and saves say why they fail; the file is left as the newer version wrote it."""
    path = tmp_path / "c.db"
    _searchable(path, 2)
    raw = sqlite3.connect(path)
    raw.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', '99')")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    db = ConversationDB(path)
    found, notices = db.list_all()
    assert sorted(c.id for c in found) == ["c0", "c1"] and db.read_only and len(db.load("c1").turns) == 1
    assert len(notices) == 1 and "newer version of Specula (schema 99)" in notices[0]
    assert "kept in memory" in notices[0] and "\n" not in notices[0]
    assert {c for c, _, _ in db.search("lorem")} == {"c0", "c1"}
    with pytest.raises(StoreError, match="newer version of Specula"):
        db.save(db.load("c1").with_turn(Turn("assistant", "an answer")))
    with pytest.raises(StoreError, match="newer version of Specula"):
        db.begin_answer(_chat("new", "a new chat"))
    db.close()
    assert path.read_bytes() == before
    assert ConversationDB(path).list_all()[1] == notices  # said again at each start
