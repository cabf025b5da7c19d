"""The model's own phrases: which token followed each run of 2-4 tokens in the target's earlier answers, as a
source of drafts that costs no model at all.

A small chat model says the same things across answers (an answer's opening, "I hope this helps", a list's
markup, a code block's last lines), so the token that most often followed the last few tokens in its own
answers is often the one it picks again. A draft follows the longest run (4 tokens, then 3, then 2) whose
favourite next token holds at least MIN_SHARE of at least MIN_COUNT occurrences, token by token, up to k.
Prompt lookup finds what the conversation itself holds; this finds what the model's other answers hold, so
`auto` offers it where prompt lookup has no match longer than one token.

Two sources, counted together: a table shipped for a model (`phrases.npz` in a folder beside its heads; the
bundled model's counts its 3.5 million answer tokens in training/, `specula train-head --kind phrases`), and
the answers of this process, each learned once it ends, so that any model gains from its own habits as a
conversation goes on. Run keys are 64-bit hashes of the tokens (a collision proposes a wrong token, which
the target rejects: drafts never change what is kept)."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from ..api.errors import SpeculaError, first_line
from ..decoding.drafter import DraftContext
from .answer_history import history_state

ORDERS = (4, 3, 2)  # run lengths, longest first
MIN_COUNT = 3  # a run seen fewer times says too little
MIN_SHARE = 0.5  # the favourite's share of what followed the run
# before the answer: the prompt's last tokens a learned run may start in (a chat template's opening of the
# assistant's turn, so that answers' first tokens are learned too)
PROMPT_TAIL = 3
SESSION_RUNS = 500_000  # runs learned in this process before the learned counts start over
_MULT = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
FILE, INFO = "phrases.npz", "phrases.json"
FORMAT = 1


def run_key(tokens: Sequence[int], n: int) -> int:
    """The hash of the last n tokens (the same as `run_keys`' for an array)."""
    h = n
    for t in tokens[len(tokens) - n :]:
        h = (h * _MULT + int(t) + 1) & _MASK
    return h


def run_keys(seq: np.ndarray, ends: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of the n tokens ending at each of `ends` (uint64), and which of them hold no separator (-1)."""
    h = np.full(ends.shape[0], n, dtype=np.uint64)
    ok = np.ones(ends.shape[0], dtype=bool)
    for back in range(n - 1, -1, -1):  # oldest token first
        tok = seq[ends - back]
        ok &= tok >= 0
        h = h * np.uint64(_MULT) + (tok + 1).astype(np.uint64)  # modulo 2**64, as run_key's
    return h, ok


def _runs_before(tokens: Sequence[int], start: int) -> Iterable[tuple[tuple[int, int], int]]:
    """((n, the key of the run of n before it), token) for each token of tokens[start:] and each order n that fits
    before it: what `learn` counts and `hiding` counts out."""
    for i in range(max(start, 1), len(tokens)):
        nxt = int(tokens[i])
        for n in ORDERS:
            if i >= n:
                yield (n, run_key(tokens[i - n : i], n)), nxt


@dataclass
class _Order:
    keys: np.ndarray  # (R,) uint64, sorted
    nexts: np.ndarray  # (R,) int64: each run's favourite next token
    counts: np.ndarray  # (R,) int64: how often it followed
    totals: np.ndarray  # (R,) int64: how often the run was followed at all

    def find(self, key: int) -> tuple[int, int, int] | None:
        i = int(np.searchsorted(self.keys, np.uint64(key)))
        if i < self.keys.shape[0] and int(self.keys[i]) == key:
            return int(self.nexts[i]), int(self.counts[i]), int(self.totals[i])
        return None


def _empty() -> _Order:
    return _Order(np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))


def count_runs(sequences: Iterable[Sequence[int]], n: int, min_count: int = MIN_COUNT,
               min_share: float = MIN_SHARE) -> _Order:
    """Every run of n tokens in the sequences with its favourite next token (ties: the smallest id), kept
    where the run occurred at least min_count times and the favourite followed at least min_share of them."""
    parts = [np.append(np.asarray(s, dtype=np.int64), -1) for s in sequences]
    if not parts:
        return _empty()
    seq = np.concatenate(parts)
    ends = np.arange(n - 1, seq.shape[0] - 1)
    keys, ok = run_keys(seq, ends, n)
    nxt = seq[ends + 1]
    ok &= nxt >= 0
    keys, nxt = keys[ok], nxt[ok]
    if keys.shape[0] == 0:
        return _empty()
    order = np.lexsort((nxt, keys))
    keys, nxt = keys[order], nxt[order]
    first = np.ones(keys.shape[0], dtype=bool)
    first[1:] = (keys[1:] != keys[:-1]) | (nxt[1:] != nxt[:-1])
    starts = np.flatnonzero(first)
    pair_counts = np.diff(np.append(starts, keys.shape[0]))
    keys, nxt = keys[starts], nxt[starts]
    # within a run: by count, then by token id downwards, so that each run's last entry is its favourite
    order = np.lexsort((-nxt, pair_counts, keys))
    keys, nxt, pair_counts = keys[order], nxt[order], pair_counts[order]
    last = np.ones(keys.shape[0], dtype=bool)
    last[:-1] = keys[1:] != keys[:-1]
    group_starts = np.flatnonzero(np.concatenate(([True], last[:-1])))
    totals = np.add.reduceat(pair_counts, group_starts)
    keys, nxt, counts = keys[last], nxt[last], pair_counts[last]
    kept = (totals >= min_count) & (counts >= min_share * totals)
    return _Order(keys[kept], nxt[kept], counts[kept], totals[kept])


@dataclass
class PhraseTable:
    """Runs of ORDERS tokens -> the favourite next token, from a shipped table and this process's answers."""

    orders: dict[int, _Order] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    learned: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)  # (n, key) -> next -> count
    # the conversation history the learned counts follow, and its epoch when they started (answer_history.py)
    history: Path | None = None
    epoch: int = 0

    def sync(self) -> None:
        """Forget the learned counts where answers left the history since they started (a chat deleted, the
        corpora cleared): they may hold those answers' runs."""
        if self.history is None:
            return
        epoch = history_state(self.history).epoch
        if epoch != self.epoch:
            self.learned.clear()
            self.epoch = epoch

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]], info: dict | None = None) -> "PhraseTable":
        return cls({n: count_runs(sequences, n) for n in ORDERS}, dict(info or {}))

    @property
    def runs(self) -> int:
        return sum(o.keys.shape[0] for o in self.orders.values())

    def favourite(self, tokens: Sequence[int], n: int) -> tuple[int, int, int] | None:
        """(token, its count, the run's total) for the last n tokens: the shipped counts and the learned ones
        together (the shipped table keeps only each run's favourite: another token's shipped count is taken
        as none)."""
        key = run_key(tokens, n)
        order = self.orders.get(n)
        shipped = order.find(key) if order is not None else None
        learned = self.learned.get((n, key))
        if learned is None:
            return shipped
        best_token, best_count = None, 0
        for token, c in learned.items():
            c += shipped[1] if shipped is not None and token == shipped[0] else 0
            if c <= 0:  # counted out for this answer (`hiding`)
                continue
            if c > best_count or (c == best_count and token < best_token):
                best_token, best_count = token, c
        if shipped is not None and shipped[1] > best_count:
            best_token, best_count = shipped[0], shipped[1]
        return best_token, best_count, (shipped[2] if shipped is not None else 0) + sum(learned.values())

    def draft(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens after `tokens`: each the favourite after the longest run that has a clear one."""
        ctx = [int(t) for t in tokens[max(0, len(tokens) - max(ORDERS)) :]]
        out: list[int] = []
        while len(out) < k:
            pick = None
            for n in ORDERS:
                if len(ctx) < n:
                    continue
                found = self.favourite(ctx, n)
                if found is not None and found[2] >= MIN_COUNT and found[1] >= MIN_SHARE * found[2]:
                    pick = found[0]
                    break
            if pick is None:
                break
            out.append(pick)
            ctx.append(pick)
        return out

    def learn(self, tokens: Sequence[int], start: int) -> None:
        """Count the runs that led to tokens[start:] (each token after the run of n before it)."""
        if len(self.learned) > SESSION_RUNS:
            self.learned.clear()
        for key, nxt in _runs_before(tokens, start):
            seen = self.learned.setdefault(key, {})
            seen[nxt] = seen.get(nxt, 0) + 1

    @contextmanager
    def hiding(self, answers: list) -> Iterator[None]:
        """For the `with` block, the learned counts less each run inside `answers` (token ids) and the token after
        it, where counted: as if they had not been learned (the shipped table is not touched)."""
        kept: dict[tuple[int, int], dict[int, int]] = {}
        for answer in answers:
            for key, nxt in _runs_before(answer, 1):
                seen = self.learned.get(key)
                if seen is None or seen.get(nxt, 0) <= 0:
                    continue
                kept.setdefault(key, dict(seen))
                seen[nxt] -= 1
        try:
            yield
        finally:
            self.learned.update(kept)

    def save(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {}
        for n, o in self.orders.items():
            arrays.update({f"keys{n}": o.keys, f"nexts{n}": o.nexts.astype(np.int32),
                           f"counts{n}": o.counts.astype(np.uint32), f"totals{n}": o.totals.astype(np.uint32)})
        np.savez_compressed(folder / FILE, **arrays)
        (folder / INFO).write_text(json.dumps({"format": FORMAT, **self.info}, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> "PhraseTable":
        folder = Path(folder)
        try:
            info = json.loads((folder / INFO).read_text(encoding="utf-8"))
            with np.load(folder / FILE) as z:
                orders = {n: _Order(z[f"keys{n}"].astype(np.uint64), z[f"nexts{n}"].astype(np.int64),
                                    z[f"counts{n}"].astype(np.int64), z[f"totals{n}"].astype(np.int64)) for n in ORDERS}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise SpeculaError(f"the phrase table in {folder} is unreadable: {first_line(exc)[:200]}") from None
        if info.get("format") != FORMAT:
            raise SpeculaError(f"the phrase table in {folder} has format {info.get('format')}; "
                               f"this version reads {FORMAT}")
        for o in orders.values():
            if o.keys.shape[0] > 1 and not bool(np.all(o.keys[1:] > o.keys[:-1])):
                raise SpeculaError(f"the phrase table in {folder} is unreadable: its runs are not in order")
        return cls(orders, info)


def read_answers(data: Path) -> list:
    """The answers of a train-head data folder (DATA/answers.jsonl); a folder without any is refused."""
    from ..heads.train.answers import read_answers as read_answers_file

    answers = read_answers_file(Path(data) / "answers.jsonl")
    if not answers:
        raise SpeculaError(f"no answers in {data}: a train-head run of another kind with --data {data} makes them")
    return answers


def build_table(target, answers: list) -> PhraseTable:
    """The phrase table of train-head answers (heads.train.answers.Answer), made for `target`."""
    from ..heads.config import target_fingerprint, vocabulary_fingerprint

    sequences = [a.prompt[len(a.prompt) - PROMPT_TAIL :] + a.answer for a in answers]
    info = {"target": target_fingerprint(target.model), "target_name": target.name,
            "vocabulary": vocabulary_fingerprint(target.tokenizer), "answers": len(answers),
            "answer_tokens": sum(len(a.answer) for a in answers), "orders": list(ORDERS), "min_count": MIN_COUNT,
            "min_share": MIN_SHARE}
    return PhraseTable.from_sequences(sequences, info)


def phrase_folders() -> list[Path]:
    """Folders holding a phrase table, where heads are found: the user's (DATA_DIR/heads/NAME) first, then the
    ones shipped."""
    from ..heads.store import heads_roots

    found = []
    for root in heads_roots():
        if root.is_dir():
            found += [d for d in sorted(root.iterdir()) if (d / INFO).is_file() and (d / FILE).is_file()]
    return found


def table_for(target) -> PhraseTable:
    """The first phrase table made for this model and tokenizer, else an empty one (this process's answers
    fill it), following the window's history (`sync`). A table that cannot be read is passed over: the drafts it
    would give are an optimisation."""
    from ..api.paths import conversations_db

    table = _table_for(target)
    table.history = conversations_db()
    table.epoch = history_state(table.history).epoch
    return table


def _table_for(target) -> PhraseTable:
    from ..heads.store import fingerprints

    prints = fingerprints(target)
    if prints is None:
        return PhraseTable()
    made_for, vocabulary = prints
    for folder in phrase_folders():
        try:
            info = json.loads((folder / INFO).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if info.get("target") == made_for and (vocabulary is None or info.get("vocabulary") == vocabulary):
            try:
                return PhraseTable.load(folder)
            except SpeculaError:
                continue
    return PhraseTable()


class Phrases:
    """A conversation's view of a phrase table: learns each answer once it ends (`finished`, the whole answer,
    its last step's tokens too), drafts. Within an answer prompt lookup finds what it repeats; learning between
    answers keeps the counting out of the decoding steps."""

    def __init__(self, table: PhraseTable) -> None:
        self.table = table

    def finished(self, tokens: torch.Tensor, prompt_len: int) -> None:
        """The answer ended (or was cancelled): learn it, after its prompt's last PROMPT_TAIL tokens."""
        if tokens.shape[0] > prompt_len:
            first = max(0, prompt_len - PROMPT_TAIL)
            self.table.learn(tokens[first:].tolist(), prompt_len - first)

    def leaving_out(self, answers: list[list[int]]):
        return self.table.hiding(answers)

    def draft(self, ctx: DraftContext, k: int) -> torch.Tensor:
        tail = ctx.tokens[max(0, ctx.tokens.shape[0] - max(ORDERS)) :].tolist()
        return torch.tensor(self.table.draft(tail, k), dtype=torch.long)
