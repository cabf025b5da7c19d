"""The window's conversation history as a source of the model's earlier answers, for the drafters that learn from
them (the suffix corpus, the phrases' learned counts).

The history is only read here, never written (it is opened read-only). Two keys of its `meta` table say what the
corpora may hold: CORPUS_EPOCH counts the times answers left the history on purpose (a chat deleted, the corpora
cleared in the Settings), and CORPUS_SINCE is the last turn row a corpus must not read (the corpora cleared). A
corpus keeps the epoch it was made at; where the history's is another, it is made again from the answers that
remain (`HistoryState`), so a deleted chat's answers are drafted no more and a cleared corpus stays clear.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from ..api.errors import first_line
from ..api.paths import CORPUS_EPOCH, CORPUS_SINCE

PROMPT_TAIL = 3  # the prompt's last tokens kept before each answer
REBUILD_CHARS = 1 << 21  # the newest answers' text a rebuilt corpus reads (about half of the suffix corpus's bound)


@dataclass(frozen=True)
class HistoryState:
    """What the history says of the corpora: its epoch and the last turn row they must not read."""

    epoch: int = 0
    since: int = 0


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=2)


def history_state(path: Path | None) -> HistoryState:
    """The history's CORPUS_EPOCH and CORPUS_SINCE (0 where there is no history or it says nothing)."""
    if path is None or not path.is_file():
        return HistoryState()
    try:
        with closing(_connect(path)) as db:
            rows = dict(db.execute("SELECT key, value FROM meta WHERE key IN (?, ?)", (CORPUS_EPOCH, CORPUS_SINCE)))
    except sqlite3.Error:
        return HistoryState()
    return HistoryState(_whole(rows.get(CORPUS_EPOCH)), _whole(rows.get(CORPUS_SINCE)))


def _whole(value: object) -> int:
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def earlier_answers(path: Path, budget: int = REBUILD_CHARS, since: int = 0) -> list[str]:
    """The finished answers in a conversation history (`path`, the window's database) after turn row `since`, the
    newest `budget` characters of them, oldest first; none where there is no history or it cannot be read."""
    if not path.is_file():
        return []
    answers, size = [], 0
    try:
        with closing(_connect(path)) as db:
            rows = db.execute("SELECT content FROM turns WHERE role = 'assistant' AND state = 'done' AND content != '' "
                              "AND rowid > ? ORDER BY rowid DESC", (since,))
            for (content,) in rows:
                if not isinstance(content, str):
                    continue
                answers.append(content)
                size += len(content)
                if size >= budget:
                    break
    except sqlite3.Error:
        return []
    return answers[::-1]


def encoded_answers(tokenizer, answers: list[str]) -> tuple[list[list[int]], str]:
    """The answers' tokens, each after the chat template's opening of an answer (its last PROMPT_TAIL tokens, as a
    live answer is kept), and why there are none where the tokenizer could not read them ("" otherwise)."""
    if not answers or tokenizer is None:
        return [], ""
    opening = _answer_opening(tokenizer)
    try:
        encoded = tokenizer(answers, add_special_tokens=False)["input_ids"]
    except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot read the text leaves the corpus empty
        return [], first_line(exc)[:120]
    return [opening + list(ids) for ids in encoded], ""


def _answer_opening(tokenizer) -> list[int]:
    """The last PROMPT_TAIL tokens the chat template puts before an answer; none without a template."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "."}], add_generation_prompt=True,
                                             tokenize=False)
        return list(tokenizer.encode(text, add_special_tokens=False))[-PROMPT_TAIL:]
    except Exception:  # noqa: BLE001 - a template that needs more than one user message: no opening
        return []
