"""Conversations in one SQLite database, `<data dir>/conversations.db` (the standard library's sqlite3, WAL).

A conversation is a row; each turn is a row of its own, with its tokens as one compact JSON text. Saving
a conversation writes only what changed since it was last read or written: new turns are appended, and
turns after an edit or a regeneration are replaced; a whole conversation is never rewritten. So a save
costs about the same whatever the conversation's size.

An answer being generated is written as a turn in state `streaming` and its text updated now and then;
if the app dies before the answer finishes, the next start finds it and marks it `interrupted` (shown,
kept, and left out of later prompts).

Full-text search covers every turn of every conversation (FTS5). Before a run's first search the index is
checked (`index_damaged`: it reads the whole index, about a second for 80 MB of chats, so it waits until a search
needs it) and rebuilt from the turns where it lost them (its table dropped and made again, empty) or fails FTS5's
integrity check (garbled blocks); a search that finds it damaged rebuilds it too. The JSON files of earlier versions
(`<data dir>/conversations/*.json`) are imported once and left where they are.

A database of a newer version (its `schema` in `meta` above SCHEMA_VERSION) is opened to read only: its chats
are shown and nothing is written to it, so that this version never changes what a newer one made.
"""

from __future__ import annotations

import gc
import json
import logging
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

from specula.app.history import Conversation, TokenRecord, Turn, sane_time
from specula.app.storage import read_json, set_aside
from specula.engine.api.paths import CORPUS_EPOCH, CORPUS_FOLDER, CORPUS_SINCE

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1

# the search index: every turn's text by its row in `turns` (the triggers below keep it in step)
INDEX = "CREATE VIRTUAL TABLE IF NOT EXISTS turns_text USING fts5(content, conversation UNINDEXED, idx UNINDEXED)"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS turns (
    conversation TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '',
    note TEXT NOT NULL DEFAULT '',
    tokens TEXT,
    state TEXT NOT NULL DEFAULT 'done',
    versions TEXT,
    PRIMARY KEY (conversation, idx));
{INDEX};
CREATE TRIGGER IF NOT EXISTS turns_added AFTER INSERT ON turns BEGIN
    INSERT INTO turns_text (rowid, content, conversation, idx)
    VALUES (new.rowid, new.content, new.conversation, new.idx);
END;
CREATE TRIGGER IF NOT EXISTS turns_removed AFTER DELETE ON turns BEGIN
    DELETE FROM turns_text WHERE rowid = old.rowid;
END;
CREATE TRIGGER IF NOT EXISTS turns_changed AFTER UPDATE OF content ON turns BEGIN
    UPDATE turns_text SET content = new.content WHERE rowid = old.rowid;
END;
"""

# the tables FTS5 keeps the search index in: every save writes them (through the triggers above)
INDEX_TABLES = ("turns_text_data", "turns_text_idx", "turns_text_content", "turns_text_docsize", "turns_text_config")

STREAMING, INTERRUPTED, DONE = "streaming", "interrupted", "done"
READ_BATCH = 64  # turns read between two chances for other threads to run
LARGE_TOKENS = 100_000  # a chat with more token records than this is kept out of the garbage collector's way
INTERRUPTED_NOTE = "Interrupted: Specula stopped before this answer finished. It is not sent with later messages."


class StoreError(Exception):
    """A read or write of the database failed; the message says what and where."""


class NewerDatabase(Exception):
    """The database is a newer version's (its schema is above SCHEMA_VERSION): read, never written."""


class ConversationDB:
    def __init__(self, path: Path | None = None, legacy_folder: Path | None = None) -> None:
        if path is None:
            from specula.engine.api.paths import conversations_db, data_dir

            path = conversations_db()
            legacy_folder = legacy_folder or data_dir() / "conversations"
        self.path = Path(path)
        self.legacy_folder = legacy_folder
        self._db: sqlite3.Connection | None = None
        self._saved: dict[str, tuple[Turn, ...]] = {}  # what the database holds, as last read or written
        self._notices: list[str] = []  # for the next load_all
        self.read_only = False  # opened to read only: it cannot be written here (see _read_only)
        self._why_read_only = "cannot be written here"
        self._index_checked = False  # the search index was checked in this run (before the first search)

    # -- opening ------------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self._db = self._open()
                self.read_only = False
            except NewerDatabase as exc:
                self._db = self._read_only(exc)
            except sqlite3.DatabaseError as exc:
                if _corrupt(exc):
                    self._db = self._salvage(exc)
                else:
                    self._db = self._read_only(exc)
            except (sqlite3.Error, OSError) as exc:
                self._db = self._read_only(exc)
        return self._db

    def _read_only(self, exc: Exception) -> sqlite3.Connection:
        """A database that cannot be written here (a read-only folder or file) but can be read: opened to read, so
        the chats are shown; saves say why they fail and are tried again (`_write` opens it anew)."""
        failure = StoreError(f"cannot open the conversations database {self.path}: {_why(self.path, exc)}")
        if not self.path.is_file():
            raise failure from exc
        for options in ("mode=ro", "immutable=1"):  # immutable: where even the journal's shared memory is read-only
            try:
                db = sqlite3.connect(f"{self.path.resolve().as_uri()}?{options}", uri=True, isolation_level=None,
                                     timeout=0.1)
            except sqlite3.Error:
                continue
            try:
                _check_tables(db)
                db.execute("SELECT COUNT(*) FROM turns").fetchone()
            except sqlite3.Error:
                db.close()
                continue
            if not self.read_only:
                self._notices.append(_read_only_notice(self.path, exc))
            self.read_only = True
            self._why_read_only = str(exc) if isinstance(exc, NewerDatabase) else "cannot be written here"
            return db
        raise failure from exc

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, timeout=0.1)  # never hold the GUI long
        try:
            newer = _newer_schema(db)
            if newer:  # before anything below writes to it
                raise NewerDatabase(f"is from a newer version of Specula (schema {newer})")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # a crash of the app loses nothing committed
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("PRAGMA recursive_triggers=ON")  # rows removed by a cascade or a replace leave the index too
            db.executescript(SCHEMA)
            _check_tables(db)
            _check_index(db)
            if "versions" not in {row[1] for row in db.execute("PRAGMA table_info(turns)")}:  # a database of 0.x
                db.execute("ALTER TABLE turns ADD COLUMN versions TEXT")
        except BaseException:
            db.close()
            raise
        return db

    def _salvage(self, exc: Exception) -> sqlite3.Connection:
        """A damaged database (a page, its search index; or a file that is not one) is moved aside for the user
        with its journal, and a new one is made holding every conversation that can still be read from it."""
        self.close()
        try:
            moved = set_aside(self.path)
            for extra in ("-wal", "-shm"):  # the journal holds committed answers not yet in the file: it goes along
                journal = Path(f"{self.path}{extra}")
                if journal.exists():
                    journal.replace(Path(f"{moved}{extra}"))
            db = self._open()
        except (sqlite3.Error, OSError) as again:
            raise StoreError(f"the conversations database {self.path} is damaged ({exc}) and could not be "
                             f"replaced: {again}") from again
        kept, lost = _copy_readable(moved, db)
        self._saved.clear()  # what the new database holds is read again before the next save
        whole = "all" if not lost else f"{kept} of {kept + lost}"
        self._notices.append(
            f"The conversations database {self.path.name} was damaged ({exc}); it was moved to {moved.name} and "
            + (f"{whole} conversations were kept in a new one." if kept else "a new one was started."))
        return db

    def take_notices(self) -> list[str]:
        """What the store has to tell since it was last asked (a damaged database salvaged during a save)."""
        notices, self._notices = self._notices, []
        return notices

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _write(self, what: str, statements, again: bool = True) -> None:
        """Run `statements(db)` in one transaction; a failure leaves the database as it was. A database found
        damaged here is salvaged (`_salvage`) and the write made once more, in the new one. A database opened
        read-only is opened anew first (the folder may be writable by now)."""
        if self.read_only:
            self.close()
        db = self._connect()
        if self.read_only:
            raise StoreError(f"could not save {what}: the conversations database {self.path} {self._why_read_only}")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                statements(db)
            except BaseException:
                self._roll_back(db)
                raise
            db.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            exc = _diagnosed(db, exc)
            if not (again and _corrupt(exc)):
                raise StoreError(f"could not save {what} to {self.path}: {exc}") from exc
            self._db = self._salvage(exc)
            self._write(what, statements, again=False)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"could not save {what} to {self.path}: {exc}") from exc

    def _roll_back(self, db: sqlite3.Connection) -> None:
        """Undo a failed write's transaction unless SQLite already has (it does after some errors): a ROLLBACK
        that fails must not hide why the write failed, and a connection it leaves mid-transaction is closed."""
        if not db.in_transaction:
            return
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            self.close()  # closing rolls the transaction back

    # -- reading ------------------------------------------------------------------------------------
    def load_all(self) -> tuple[list[Conversation], list[str]]:
        """Every conversation with its turns, newest first, and the notices of `list_all`."""
        listed, notices = self.list_all()
        return [self.load(c.id) for c in listed], notices

    def load(self, conversation_id: str) -> Conversation:
        """One conversation with its turns (a damaged database is salvaged by the window's own connection, when
        it lists or saves: never here, where a helper thread may read with a connection of its own)."""
        db = self._connect()
        try:
            row = db.execute("SELECT id, title, created, updated FROM conversations WHERE id = ?",
                             (conversation_id,)).fetchone()
            if row is None:
                raise StoreError(f"there is no conversation {conversation_id} in {self.path}")
            # no garbage collection while a large chat's million token records are made: a full collection
            # over them holds every thread (the window's too) for a quarter of a second, and they hold no cycles
            collecting = gc.isenabled()
            gc.disable()
            try:
                conv = _conversation(*row, turns=self._turns(db, conversation_id))
                if sum(len(t.tokens) for t in conv.turns) > LARGE_TOKENS:
                    gc.freeze()  # and later collections pass over them (they live as long as the chat is open)
            finally:
                if collecting:
                    gc.enable()
        except (sqlite3.Error, ValueError) as exc:
            raise StoreError(f"could not read a conversation from {self.path}: {exc}") from exc
        self._saved[conv.id] = conv.turns
        return conv

    def turn_counts(self) -> dict[str, int]:
        """Each conversation's number of turns: what reading it costs, counted from the index alone (summing
        the stored text would read the whole database, 0.2 s for 50 MB)."""
        try:
            rows = self._connect().execute("SELECT conversation, COUNT(*) FROM turns GROUP BY conversation").fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"could not read the conversations database {self.path}: {exc}") from exc
        return dict(rows)

    def adopt(self, conversation: Conversation) -> None:
        """A conversation read by another connection (in the background) is what this one last read."""
        self._saved[conversation.id] = conversation.turns

    def list_all(self, again: bool = True) -> tuple[list[Conversation], list[str]]:
        """Every conversation without its turns (`load` reads them), newest first, and notices (imports,
        interrupted answers). Answers left `streaming` by an earlier run that died are marked interrupted."""
        db = self._connect()
        notices = self._notices + (self._import_legacy() if not self.read_only else [])
        self._notices = []
        try:
            cut = db.execute("SELECT COUNT(*) FROM turns WHERE state = ?", (STREAMING,)).fetchone()[0]
            if cut and not self.read_only:
                db.execute("UPDATE turns SET state = ? WHERE state = ?", (INTERRUPTED, STREAMING))
                notices.append(f"{cut} answer{'s' if cut > 1 else ''} cut short when Specula last stopped "
                               f"{'were' if cut > 1 else 'was'} kept and marked interrupted.")
            rows = db.execute("SELECT id, title, created, updated FROM conversations ORDER BY updated DESC").fetchall()
            conversations = [_conversation(*row) for row in rows]
        except sqlite3.Error as exc:
            if again and isinstance(exc, sqlite3.DatabaseError) and _corrupt(exc):
                self._db = self._salvage(exc)
                conversations, more = self.list_all(again=False)
                return conversations, notices + more
            raise StoreError(f"could not read the conversations database {self.path}: {exc}") from exc
        # in the order of their dates as read: one that is no date (unknown) goes last, where SQL put 1e300 first
        return sorted(conversations, key=lambda c: c.updated, reverse=True), notices

    def _turns(self, db: sqlite3.Connection, conversation_id: str) -> tuple[Turn, ...]:
        cursor = db.execute("SELECT role, content, summary, note, tokens, state, versions FROM turns "
                            "WHERE conversation = ? ORDER BY idx", (conversation_id,))
        turns: list[Turn] = []
        while rows := cursor.fetchmany(READ_BATCH):
            turns += (Turn(_text(role), _text(content), _tokens(tokens), _text(summary),
                           _text(note) or (INTERRUPTED_NOTE if state == INTERRUPTED else ""), state == INTERRUPTED,
                           *_versions(versions))
                      for role, content, summary, note, tokens, state, versions in rows)
            time.sleep(0)  # a read on a helper thread lets the window's thread run between batches
        return tuple(turns)

    def search(self, text: str, limit: int = 50, again: bool = True) -> list[tuple[str, int, str]]:
        """(conversation id, turn index, snippet) of the turns that contain all of the words in `text`,
        best matches first. A search index found damaged is rebuilt and the search made once more."""
        words = [w.replace('"', '""') for w in text.split()]
        if not words:
            return []
        query = " ".join(f'"{w}"' for w in words)  # each word as a literal: no FTS syntax from the user
        if not self._index_checked:
            self._connect()  # opened first: whether it can be written is known
            self._index_checked = True
            self._repair_index()
        try:
            rows = self._connect().execute(
                "SELECT conversation, idx, snippet(turns_text, 0, '[', ']', '…', 12) FROM turns_text "
                "WHERE turns_text MATCH ? ORDER BY rank LIMIT ?", (query, limit)).fetchall()
        except sqlite3.Error as exc:
            if again and isinstance(exc, sqlite3.DatabaseError) and _corrupt(exc) and self._repair_index():
                return self.search(text, limit, again=False)
            raise StoreError(f"could not search {self.path}: {exc}") from exc
        return [(c, int(i), s) for c, i, s in rows]

    # -- the search index ---------------------------------------------------------------------------
    def index_damaged(self) -> bool:
        """Whether the search index lost turns (its table dropped and made again, empty) or fails FTS5's
        integrity check (garbled blocks: searches that find nothing or fail). Reads the whole index (about a
        second for 80 MB of chats). An index that cannot be read for another reason (a lock) is not called
        damaged."""
        try:
            db = self._connect()
            turns = db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
            if db.execute("SELECT COUNT(*) FROM turns_text").fetchone()[0] != turns:
                return True
            db.execute("INSERT INTO turns_text (turns_text) VALUES ('integrity-check')")  # writes nothing
        except sqlite3.DatabaseError as exc:
            return _corrupt(exc)
        except (sqlite3.Error, StoreError, OSError):
            return False
        return False

    def _repair_index(self) -> bool:
        """Rebuild the search index if it is damaged; whether it was (a rebuild that fails is logged: the search
        goes on with the index as it is)."""
        if self.read_only or not self.index_damaged():
            return False
        try:
            self.rebuild_index()
        except StoreError as exc:
            log.warning("the search index of %s is damaged and could not be rebuilt: %s", self.path, exc)
            return False
        return True

    def rebuild_index(self) -> None:
        """The search index made again from every turn (the log says so: nothing was lost but time)."""

        def statements(db: sqlite3.Connection) -> None:
            db.execute("DROP TABLE IF EXISTS turns_text")  # its damaged blocks are never read
            db.execute(INDEX)
            db.execute("INSERT INTO turns_text (rowid, content, conversation, idx) "
                       "SELECT rowid, content, conversation, idx FROM turns")

        self._write("the rebuilt search index", statements)
        log.warning("the search index of %s was damaged and has been rebuilt from the conversations", self.path)

    # -- writing ------------------------------------------------------------------------------------
    def save(self, conversation: Conversation) -> None:
        """Write what changed since the conversation was last read or written."""
        self._write(f"the conversation “{conversation.title}”", self._changes(conversation))
        self._saved[conversation.id] = conversation.turns

    def _changes(self, conversation: Conversation):
        """The statements that write what changed of a conversation since it was last read or written."""
        saved = self._saved.get(conversation.id)
        if saved is None:  # not read in this run: compare with what the database holds, never assume it empty
            try:
                saved = self._turns(self._connect(), conversation.id)
            except (sqlite3.Error, ValueError) as exc:
                raise StoreError(f"could not read a conversation from {self.path}: {exc}") from exc
        turns = conversation.turns
        same = 0
        if saved is not None:
            while same < min(len(saved), len(turns)) and (saved[same] is turns[same] or saved[same] == turns[same]):
                same += 1

        def statements(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO conversations (id, title, created, updated) VALUES (?, ?, ?, ?) "
                       "ON CONFLICT(id) DO UPDATE SET title = excluded.title, updated = excluded.updated",
                       (conversation.id, conversation.title, conversation.created, conversation.updated))
            _close_gaps(db, conversation.id)  # turn i is at idx i below: never delete a turn by a wrong count
            db.execute("DELETE FROM turns WHERE conversation = ? AND idx >= ?", (conversation.id, same))
            _insert_turns(db, conversation.id, turns, same)

        return statements

    def begin_answer(self, conversation: Conversation) -> None:
        """An answer starts after the conversation's last turn: written as `streaming` until it ends, in one
        transaction with what changed of the conversation before it (the message it answers), so that a kill
        never leaves a message saved without its answer's row (the next start marks that row interrupted)."""
        index = len(conversation.turns)
        changes = self._changes(conversation)

        def statements(db: sqlite3.Connection) -> None:
            changes(db)  # turns from `index` on are gone with the rest of what changed
            db.execute("INSERT INTO turns (conversation, idx, role, content, state) VALUES (?, ?, 'assistant', '', ?)",
                       (conversation.id, index, STREAMING))

        self._write("the answer in progress", statements)
        self._saved[conversation.id] = conversation.turns

    def update_answer(self, conversation: Conversation, text: str) -> None:
        """The text of the answer in progress so far (kept if the app dies before it ends)."""
        index = len(conversation.turns)
        self._write("the answer in progress", lambda db: db.execute(
            "UPDATE turns SET content = ? WHERE conversation = ? AND idx = ? AND state = ?",
            (text, conversation.id, index, STREAMING)))

    def rename(self, conversation_id: str, title: str) -> None:
        self._write("the new title", lambda db: db.execute("UPDATE conversations SET title = ? WHERE id = ?",
                                                           (title, conversation_id)))

    def delete(self, conversation_id: str) -> None:
        """Delete a conversation; the drafters' corpora leave out its answers from the next answer on (a new
        epoch: they are made again from the history that remains), and their files, which hold its text, go now."""

        def statements(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
            _new_corpus_epoch(db)

        self._write("the deletion", statements)
        self._saved.pop(conversation_id, None)
        self._remove_corpus_files()

    @property
    def corpus_folder(self) -> Path:
        """Where the drafters keep the model's earlier answers, one file per model (beside this database)."""
        return self.path.parent / CORPUS_FOLDER

    def corpus_size(self) -> tuple[int, int]:
        """The corpora kept now: (files, bytes)."""
        sizes = [f.stat().st_size for f in self.corpus_folder.glob("*.npz") if f.is_file()]
        return len(sizes), sum(sizes)

    def _remove_corpus_files(self) -> None:
        for file in self.corpus_folder.glob("*.npz"):
            try:
                file.unlink()
            except OSError as exc:  # the engine makes it again from the history and writes it over
                log.warning("could not remove %s: %s", file, exc)

    def clear_corpus(self) -> None:
        """The drafters' corpora start again empty: they read no answer written before now (the chats stay)."""

        def statements(db: sqlite3.Connection) -> None:
            last = db.execute("SELECT COALESCE(MAX(rowid), 0) FROM turns").fetchone()[0]
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (CORPUS_SINCE, str(int(last))))
            _new_corpus_epoch(db)

        self._write("the cleared corpus", statements)
        self._remove_corpus_files()

    # -- the JSON files of earlier versions ---------------------------------------------------------
    def _import_legacy(self) -> list[str]:
        """Import `conversations/*.json` once (the files stay); unreadable ones are named and skipped, and so is a
        conversation the database refuses, the others kept. An import that cannot be written is said and tried
        again at the next start: the chats of this database are listed all the same."""
        db = self._connect()
        if db.execute("SELECT 1 FROM meta WHERE key = 'imported_json'").fetchone():
            return []
        folder = self.legacy_folder
        conversations, skipped = [], []
        if folder is not None and Path(folder).is_dir():
            for path in sorted(Path(folder).glob("*.json")):
                try:
                    conversations.append((path.name, _dated(Conversation.from_dict(read_json(path)), path)))
                except (OSError, ValueError, KeyError, TypeError, RecursionError):  # versions nested too deeply
                    skipped.append(path.name)
        imported, refused = [], []

        def statements(db: sqlite3.Connection) -> None:
            imported.clear()
            refused.clear()
            for name, conv in conversations:
                if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conv.id,)).fetchone():
                    continue
                db.execute("SAVEPOINT one")  # a conversation the database refuses is left out, not the import
                try:
                    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES (?, ?, ?, ?)",
                               (conv.id, conv.title, conv.created, conv.updated))
                    _insert_turns(db, conv.id, conv.turns)
                except (sqlite3.IntegrityError, sqlite3.InterfaceError):  # a value no column takes
                    db.execute("ROLLBACK TO one")
                    refused.append(name)
                else:
                    imported.append(name)
                db.execute("RELEASE one")
            db.execute("INSERT INTO meta (key, value) VALUES ('imported_json', ?)", (str(time.time()),))
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))

        try:
            self._write("the imported conversations", statements)
        except StoreError as exc:
            return [f"The conversations of an earlier version in {folder} were not imported ({exc}); they are tried "
                    "again at the next start."]
        notices = []
        if imported:
            notices.append(f"{len(imported)} conversations were imported from {folder} (the files are kept).")
        if skipped or refused:
            notices.append(f"Unreadable conversation files were not imported: {', '.join(skipped + refused)}.")
        return notices


def _new_corpus_epoch(db: sqlite3.Connection) -> None:
    """Answers left the history: the drafters' corpora, which keep the epoch they were made at, are made again."""
    row = db.execute("SELECT value FROM meta WHERE key = ?", (CORPUS_EPOCH,)).fetchone()
    try:
        epoch = int(row[0]) if row is not None else 0
    except (TypeError, ValueError):
        epoch = 0
    db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (CORPUS_EPOCH, str(epoch + 1)))


def _dated(conversation: Conversation, path: Path) -> Conversation:
    """An imported conversation whose dates are damaged (unknown) takes its file's date."""
    if conversation.updated:
        return conversation
    when = sane_time(path.stat().st_mtime)
    return replace(conversation, created=conversation.created or when, updated=when)


def _insert_turns(db: sqlite3.Connection, conversation_id: str, turns: tuple[Turn, ...], start: int = 0) -> None:
    """Write turns[start:] as the conversation's turns from index `start` on."""
    db.executemany(
        "INSERT INTO turns (conversation, idx, role, content, summary, note, tokens, state, versions) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(conversation_id, i, t.role, t.content, t.summary, t.note, _tokens_text(t.tokens),
          INTERRUPTED if t.interrupted else DONE, _versions_text(t)) for i, t in enumerate(turns[start:], start=start)])


def _versions_text(turn: Turn) -> str | None:
    """An answer's other versions (Regenerate keeps them) and which one is shown."""
    if not turn.versions:
        return None
    return json.dumps({"position": turn.version, "versions": [v.to_dict() for v in turn.versions]},
                      ensure_ascii=False, separators=(",", ":"))


def _versions(text) -> tuple[tuple[Turn, ...], int]:
    """(versions, position) of a turn; damaged ones are dropped (the shown version stays), and so are ones nested
    deeper than Python's JSON reader goes."""
    try:
        data = json.loads(text) if text else {}
        return tuple(Turn.from_dict(v) for v in data.get("versions", ())), int(data.get("position", -1))
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return (), -1


def _tokens_text(tokens: tuple[TokenRecord, ...]) -> str | None:
    return json.dumps([t.to_list() for t in tokens], ensure_ascii=False, separators=(",", ":")) if tokens else None


def _tokens(text) -> tuple[TokenRecord, ...]:
    """A turn's token records; damaged ones (or nested too deeply to read) are dropped (the turn still shows, as
    plain text)."""
    try:
        return tuple(TokenRecord.from_list(row) for row in json.loads(text)) if text else ()
    except (ValueError, TypeError, KeyError, IndexError, RecursionError):
        return ()


def _text(value) -> str:
    """A text column as text, whatever another program stored there (a blob, a number, NULL)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return "" if value is None else str(value)


def _conversation(conversation_id, title, created, updated, turns=()) -> Conversation:
    """A row as a conversation; a date that is none (text, 1e300, a date in milliseconds) is unknown (0.0)."""
    return Conversation(_text(conversation_id), _text(title) or "New chat", sane_time(created), sane_time(updated),
                        turns)


def _newer_schema(db: sqlite3.Connection) -> int:
    """The schema of a database a newer version made (above SCHEMA_VERSION); 0 for ours, an older one or a new file."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    except sqlite3.Error:  # no such table (a new file), or no database: the checks that follow say which
        return 0
    try:
        version = int(row[0]) if row else 0
    except (TypeError, ValueError):
        return 0
    return version if version > SCHEMA_VERSION else 0


def _read_only_notice(path: Path, exc: Exception) -> str:
    if isinstance(exc, NewerDatabase):
        return (f"The conversations database {path} {exc}: this version shows your chats and never changes it, "
                "so new chats are kept in memory until Specula closes.")
    return (f"The conversations database {path} cannot be written here ({exc}): your chats are shown, and new "
            "answers are kept in memory until it can be saved.")


def _why(path: Path, exc: Exception) -> str:
    """What stopped a database from opening, in words (a folder where a file belongs, and the reverse)."""
    if path.is_dir():
        return "it is a folder, not a database file"
    for folder in path.parents:
        if folder.exists():
            return str(exc) if folder.is_dir() else f"{folder} is a file, not a folder"
    return str(exc)


def _check_tables(db: sqlite3.Connection) -> None:
    """A database whose tables are not these (another program's file) is not taken for ours."""
    for table, wanted in (("conversations", {"id", "title", "created", "updated"}),
                          ("turns", {"conversation", "idx", "role", "content", "summary", "note", "tokens", "state"})):
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if not wanted <= columns:
            raise sqlite3.DatabaseError(f"not a conversations database: its table '{table}' has other columns")


def _check_index(db: sqlite3.Connection) -> None:
    """The search index can be opened and every table of it that a save writes is there and can be read (a
    missing one fails every save with no more than "SQL logic error"); raises a DatabaseError `_corrupt` knows."""
    present = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    for table in INDEX_TABLES:
        if table not in present:
            raise sqlite3.DatabaseError(f"the search index is damaged: its table '{table}' is missing")
        db.execute(f"SELECT * FROM {table} LIMIT 1").fetchall()  # a damaged first page says "malformed"
    db.execute("SELECT rowid FROM turns_text LIMIT 1").fetchall()  # the index itself can be opened


def _diagnosed(db: sqlite3.Connection, exc: sqlite3.DatabaseError) -> sqlite3.DatabaseError:
    """Why a write failed: a damaged search index if the check finds one (its tables lost while the app ran),
    else the write's own error."""
    if _corrupt(exc):
        return exc
    try:
        _check_index(db)
    except sqlite3.DatabaseError as found:
        return found if _corrupt(found) else exc
    return exc


def _corrupt(exc: sqlite3.DatabaseError) -> bool:
    """A damaged database (or not ours): a damaged page, a search index that cannot be opened or lost a table."""
    text = str(exc).lower()
    return any(sign in text for sign in ("not a database", "malformed", "not a conversations database",
                                         "vtable constructor failed", "fts5", "search index is damaged"))


def _close_gaps(db: sqlite3.Connection, conversation_id: str) -> None:
    """Number a conversation's turns 0, 1, 2... in their order where they are not (a damaged or hand-edited
    database may leave a gap): every turn kept, and the position a save counts on made true."""
    count, low, high = db.execute("SELECT COUNT(*), MIN(idx), MAX(idx) FROM turns WHERE conversation = ?",
                                  (conversation_id,)).fetchone()
    if not count or (low == 0 and high == count - 1):
        return
    rows = db.execute("SELECT rowid FROM turns WHERE conversation = ? ORDER BY idx", (conversation_id,)).fetchall()
    for step in (high + 1 + count, 0):  # past every index first, so that no two turns ever share one
        for i, (rowid,) in enumerate(rows):
            db.execute("UPDATE turns SET idx = ? WHERE rowid = ?", (step + i, rowid))
            db.execute("UPDATE turns_text SET idx = ? WHERE rowid = ?", (step + i, rowid))


def _copy_readable(source: Path, db: sqlite3.Connection) -> tuple[int, int]:
    """Copy into `db` every conversation of the damaged database `source` that can still be read (its turns
    numbered again in their order); (kept, lost)."""
    kept = lost = 0
    try:
        old = sqlite3.connect(source, isolation_level=None, timeout=0.1)
    except sqlite3.Error:
        return 0, 0
    try:
        try:
            meta = old.execute("SELECT key, value FROM meta").fetchall()
        except sqlite3.Error:
            meta = []
        found: dict[str, tuple] = {}
        for query in ("SELECT id, title, created, updated FROM conversations",
                      "SELECT DISTINCT conversation, 'Recovered chat', 0, 0 FROM turns"):  # a chat whose row is lost
            try:
                for row in old.execute(query):
                    found.setdefault(row[0], row)
            except sqlite3.Error:
                continue
        for cid, title, created, updated in found.values():
            try:
                turns = old.execute("SELECT role, content, summary, note, tokens, state, versions FROM turns "
                                    "WHERE conversation = ? ORDER BY idx", (cid,)).fetchall()
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO conversations (id, title, created, updated) VALUES (?, ?, ?, ?)",
                           (cid, title, created, updated))
                db.executemany("INSERT INTO turns (conversation, idx, role, content, summary, note, tokens, state, "
                               "versions) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                               [(cid, i, *row) for i, row in enumerate(turns)])
                db.execute("COMMIT")
                kept += 1
            except sqlite3.Error:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                lost += 1
        db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", meta)
    finally:
        old.close()
    return kept, lost
