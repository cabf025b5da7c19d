"""The target's answers that a head trains on, and the file that keeps them (DATA/answers.jsonl, one answer
a line, appended as each is made, so that a later run continues where an interrupted one stopped)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...api.errors import SpeculaError


@dataclass
class Answer:
    prompt: list[int]  # the conversation's token ids, up to the opened assistant turn
    answer: list[int]  # the target's answer (greedy or sampled), without the end token
    index: int = -1  # which generated conversation it answers (-1: a second turn)
    written: bool = False  # its first turn was written by the model itself (prompts.MODEL_QUERY)


def read_answers(path: Path | None) -> list[Answer]:
    """The answers an earlier (interrupted) run stored; a torn last line is dropped, and so is any line that is not
    an answer (one nested too deeply for Python's JSON reader among them)."""
    if path is None or not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
            out.append(Answer(list(d["prompt"]), list(d["answer"]), int(d.get("index", -1)),
                              bool(d.get("written", False))))
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return out


def drop_torn_tail(path: Path) -> None:
    """A last line cut short (a run killed while writing it: no newline at its end) is dropped before more
    answers are appended, so that the next answer starts on a line of its own instead of joining it."""
    if not path.is_file():
        return
    with path.open("r+b") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":  # whole lines: the file is not read further
            return
        f.seek(0)
        f.truncate(f.read().rfind(b"\n") + 1)


def answer_line(a: Answer) -> str:
    """An answer as its line of the file (`read_answers` reads it back)."""
    return json.dumps({"prompt": a.prompt, "answer": a.answer, "index": a.index,
                       **({"written": True} if a.written else {})}) + "\n"


def held_out_first_turns(folder: Path) -> list[tuple[str, list[int]]]:
    """A data folder's held-out tenth (its first answers, which training holds out) as (kind, prompt token ids)
    of its first turns: "written by the model" (prompts.MODEL_QUERY) or "generated"."""
    answers = read_answers(folder / "answers.jsonl")
    if not answers:
        raise SpeculaError(f"{folder} holds no training answers (answers.jsonl)")
    held = answers[: max(1, len(answers) // 10)]
    return [("written by the model" if a.written else "generated", a.prompt) for a in held if a.index >= 0]
