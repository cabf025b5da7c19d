"""`suffix`: continuations of the conversation's last tokens found in everything the model has said, scored
by how often each followed (the SuffixDecoding method; vLLM ships it as `suffix`).

Two places are searched, as one: this conversation so far (what prompt lookup searches), and every earlier
answer of the model, each with its prompt's last PROMPT_TAIL tokens (the chat template's opening of the
answer), kept in a `SuffixIndex`: one token corpus with an index of its ORDER-token runs, bounded to
MAX_TOKENS (the oldest answers leave first) and kept across sessions in the user's data folder, one file per
model; a model without one (a new model, or a corpus lost or damaged) starts from the answers in the window's
conversation history, tokenized again, and so does a corpus made before answers left the history (a chat deleted,
the corpora cleared in the Settings: `sync`, answer_history.py). Where the conversation's last ORDER tokens occur,
each occurrence's match is extended backwards (up to MAX_MATCH tokens); the occurrences whose match is at least half the longest one's are kept, and their
continuations make a tree in which each node counts the occurrences (weighted by their match length) that
continue through it. A node's share of the root's weight is how often that continuation was right here.

The draft is the tree's best nodes, best first, while their share is at least MIN_SHARE and their number at
most SPEC_FACTOR x the longest match (a long match says the text repeats: a bigger draft pays), sent as a
token tree where trees are exact and cheap (`sends_tree`), else as its best chain: at each node the child
with the most weight. The phrases table is the same idea for one token after 2-4; this is whole
continuations after up to MAX_MATCH. Nothing here runs a model: a draft costs a few hundred microseconds.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from ..api.errors import first_line
from ..api.strategies import STRATEGIES
from ..decoding.drafter import Draft, DraftContext, Drafter, empty_draft, sends_tree
from ..decoding.tree import TokenTree
from .answer_history import PROMPT_TAIL, earlier_answers, encoded_answers, history_state
from .phrases import run_keys
from .prompt_lookup import agreement

log = logging.getLogger(__name__)

ORDER = 3  # tokens in the runs the index is keyed by
MAX_MATCH = 32  # the longest match looked for, in tokens
MAX_OCCURRENCES = 64  # the latest occurrences of the last ORDER tokens considered, in each place
MAX_TOKENS = 1 << 20  # the corpus's bound (about 16 bytes a token with its index)
MIN_SHARE = 0.2  # a node drafted: at least this share of the root's weight continues through it
SPEC_FACTOR = 1.0  # nodes drafted per token of the longest match (at least 2)
SAVE_EVERY_S = 60.0  # the corpus is written at most this often (and when the process ends cleanly)
FORMAT = 1
# an answer left out (`hiding`) hides every stretch of the corpus of this many tokens that it holds too (all of an
# answer this short or shorter): its own copies whatever the tokens around them, and an answer's text tokenized
# again where it parts from the ids the model produced at a token or two
HIDE_RUN = 8
class SuffixIndex:
    """A model's earlier answers as one corpus (int32 tokens, -1 between answers) and a sorted index of its
    ORDER-token runs (hash, position of the run's last token), for `occurrences`. `visible` is what drafting reads:
    the corpus itself, or within `hiding` the corpus with some answers turned into separators."""

    def __init__(self, path: Path | None = None, history: Path | None = None, tokenizer=None) -> None:
        self.path = path
        # the conversation history the corpus follows (answer_history.py: a deleted chat's answers leave it), and
        # the tokenizer it is made again with from there; the history's epoch the corpus holds (-1: none yet)
        self.history, self.tokenizer = history, tokenizer
        self.epoch = -1
        self.tokens = np.zeros(0, dtype=np.int32)
        self.visible = self.tokens
        self._hidden: list[np.ndarray] = []  # the answers `hiding` leaves out now
        self.keys = np.zeros(0, dtype=np.uint64)
        self.positions = np.zeros(0, dtype=np.int64)
        self.note = ""  # why a saved corpus was not read (it starts empty instead)
        self._saved_at = time.monotonic()
        self._unsaved = 0
        if path is not None and path.is_file():
            self._read(path)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def add(self, sequence) -> None:
        """An answer (with its prompt's last tokens): appended, its runs indexed; the oldest answers leave
        once the corpus passes MAX_TOKENS."""
        seq = np.asarray(sequence, dtype=np.int32)
        if seq.shape[0] < 2:
            return
        start = self.tokens.shape[0]
        self.tokens = np.concatenate([self.tokens, seq, np.full(1, -1, dtype=np.int32)])
        if self.tokens.shape[0] > MAX_TOKENS:
            self._drop_oldest()  # indexed again, and shown (_reindex)
        else:
            self._insert(np.arange(start + ORDER - 1, start + seq.shape[0]))
            self._show()
        self._unsaved += seq.shape[0]
        if self.path is not None and time.monotonic() - self._saved_at >= SAVE_EVERY_S:
            self.save()

    def extend(self, sequences) -> None:
        """Many answers at once (a rebuild): appended, and the corpus indexed again once."""
        parts = [np.asarray(seq, dtype=np.int32) for seq in sequences]
        parts = [p for seq in parts if seq.shape[0] >= 2 for p in (seq, np.full(1, -1, dtype=np.int32))]
        if not parts:
            return
        self.tokens = np.concatenate([self.tokens, *parts])
        self._unsaved += sum(p.shape[0] for p in parts)
        if self.tokens.shape[0] > MAX_TOKENS:
            self._drop_oldest()
        else:
            self._reindex()

    def _runs(self, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys of the runs ending at `ends` (those without a separator), sorted, with their positions."""
        keys, ok = run_keys(self.tokens, ends, ORDER)
        order = np.argsort(keys[ok], kind="stable")
        return keys[ok][order], ends[ok][order]

    def _insert(self, ends: np.ndarray) -> None:
        keys, ends = self._runs(ends)
        at = np.searchsorted(self.keys, keys, side="right")  # after equal keys: positions stay in order
        self.keys = np.insert(self.keys, at, keys)
        self.positions = np.insert(self.positions, at, ends)

    def _drop_oldest(self) -> None:
        """Keep the latest half of MAX_TOKENS, from an answer's start, and index it again."""
        cut = self.tokens.shape[0] - MAX_TOKENS // 2
        separators = np.flatnonzero(self.tokens[cut:] < 0)
        cut += int(separators[0]) + 1 if separators.size else 0
        self.tokens = self.tokens[cut:]
        self._reindex()

    def occurrences(self, tail: np.ndarray) -> np.ndarray:
        """Positions in the corpus where the last ORDER tokens of `tail` end (the latest MAX_OCCURRENCES)."""
        if tail.shape[0] < ORDER or self.keys.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        key, _ = run_keys(tail, np.array([tail.shape[0] - 1]), ORDER)
        lo, hi = np.searchsorted(self.keys, key[0], side="left"), np.searchsorted(self.keys, key[0], side="right")
        found = self.positions[max(lo, hi - MAX_OCCURRENCES) : hi]
        return found[np.all(self.visible[found[:, None] - np.arange(ORDER)[None, ::-1]] == tail[-ORDER:], axis=1)]

    @contextmanager
    def hiding(self, answers: list) -> Iterator[None]:
        """For the `with` block, drafting reads the corpus as if `answers` (token ids) had never joined it: every
        stretch of HIDE_RUN tokens they hold reads as separators, so no occurrence matches there and no continuation
        runs into them (a Compare run re-creates an answer the corpus holds: it must not draft it from there)."""
        self._hidden = [np.asarray(a, dtype=np.int32) for a in answers if len(a) >= 2]
        self._show()
        try:
            yield
        finally:
            self._hidden = []
            self._show()

    def _show(self) -> None:
        """Make `visible` the corpus less what `hiding` leaves out (after every change of the corpus)."""
        self.visible = self.tokens
        if not self._hidden or len(self) == 0:
            return
        hide = np.zeros(len(self), dtype=bool)
        runs: dict[int, np.ndarray] = {}  # the corpus's run keys, by run length
        for answer in self._hidden:
            n = min(HIDE_RUN, answer.shape[0])
            if len(self) < n:
                continue
            if n not in runs:
                keys, ok = run_keys(self.tokens, np.arange(n - 1, len(self)), n)
                runs[n] = np.where(ok, keys, np.uint64(0))
            theirs, ok = run_keys(answer, np.arange(n - 1, answer.shape[0]), n)
            starts = np.flatnonzero(np.isin(runs[n], theirs[ok]))  # where a run of theirs starts in the corpus
            hide[(starts[:, None] + np.arange(n)[None, :]).ravel()] = True
        if hide.any():
            self.visible = np.where(hide, np.int32(-1), self.tokens)

    def save(self) -> None:
        """Write the corpus (the index is made again when read); a folder that cannot be written leaves
        the corpus in memory only."""
        if self.path is None:
            return
        if self.history is not None and history_state(self.history).epoch != self.epoch:  # chats deleted meanwhile:
            self.path.unlink(missing_ok=True)  # made again from the history at the next answer or start
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            part = self.path.with_name(self.path.name + ".part")
            with open(part, "wb") as f:
                np.savez(f, tokens=self.tokens, format=np.array([FORMAT]), epoch=np.array([self.epoch]))
            os.replace(part, self.path)
        except OSError:
            return
        self._saved_at, self._unsaved = time.monotonic(), 0

    def _read(self, path: Path) -> None:
        try:
            with np.load(path) as z:
                if int(z["format"][0]) != FORMAT:
                    raise ValueError(f"format {int(z['format'][0])}, this version reads {FORMAT}")
                tokens = z["tokens"].astype(np.int32)
                epoch = int(z["epoch"][0]) if "epoch" in z.files else 0
        except (OSError, ValueError, KeyError, EOFError) as exc:
            self.note = f"the suffix corpus {path} was not read ({first_line(exc)[:120]}): it starts again"
            return
        self.tokens, self.epoch = tokens, epoch
        if tokens.shape[0] > MAX_TOKENS:
            self._drop_oldest()
        else:
            self._reindex()

    def _reindex(self) -> None:
        self.keys, self.positions = self._runs(np.arange(ORDER - 1, self.tokens.shape[0]))
        self._show()

    def sync(self) -> None:
        """Follow the history: where answers left it since the corpus was made (its epoch changed: a chat deleted,
        the corpora cleared), make the corpus again from the answers that remain, and write it."""
        if self.history is None:
            return
        state = history_state(self.history)
        if state.epoch == self.epoch:
            return
        made = self.epoch >= 0
        self.tokens = np.zeros(0, dtype=np.int32)
        answers = earlier_answers(self.history, since=state.since)
        sequences, failed = encoded_answers(self.tokenizer, answers)
        self.extend(sequences)
        if not sequences:
            self._reindex()
        self.epoch = state.epoch
        done = (f"not rebuilt from the conversation history ({failed})" if failed else
                f"rebuilt from {len(sequences)} answers in the conversation history")
        if made:
            self.note = f"the suffix corpus was {done}: answers left the history"
        elif self.note:
            self.note = self.note.replace("it starts again", done)
        elif sequences or failed:
            self.note = f"the suffix corpus was {done}"
        if made or sequences:
            self.save()


class _Tree:
    """Continuations merged into a tree: node 0 the root; each node's token, parent, weight and children."""

    def __init__(self) -> None:
        self.token, self.parent, self.weight, self.depth = [-1], [-1], [0.0], [0]
        self.children: list[dict[int, int]] = [{}]

    def add(self, continuation: np.ndarray, weight: float) -> None:
        node = 0
        self.weight[0] += weight
        for t in continuation.tolist():
            if t < 0:  # the end of an answer
                break
            child = self.children[node].get(t)
            if child is None:
                child = len(self.token)
                self.children[node][t] = child
                self.token.append(t)
                self.parent.append(node)
                self.weight.append(0.0)
                self.depth.append(self.depth[node] + 1)
                self.children.append({})
            self.weight[child] += weight
            node = child

    def chain(self, budget: int) -> list[int]:
        """The heaviest child at each node, while its share is at least MIN_SHARE."""
        out, node, total = [], 0, self.weight[0]
        while len(out) < budget and self.children[node]:
            child = max(self.children[node].values(), key=lambda c: (self.weight[c], -self.token[c]))
            if self.weight[child] < MIN_SHARE * total:
                break
            out.append(self.token[child])
            node = child
        return out

    def best(self, budget: int) -> tuple[list[int], list[int]]:
        """The best `budget` nodes with a share of at least MIN_SHARE, best first (a node's parent is always
        among them: a child weighs no more than its parent): their tokens and parents (-1: the root)."""
        total = self.weight[0]
        nodes = sorted((n for n in range(1, len(self.token)) if self.weight[n] >= MIN_SHARE * total),
                       key=lambda n: (-self.weight[n], self.depth[n], n))[:budget]
        nodes.sort(key=lambda n: (self.depth[n], -self.weight[n], n))  # parents before children
        index = {n: i for i, n in enumerate(nodes)}
        return [self.token[n] for n in nodes], [index.get(self.parent[n], -1) for n in nodes]


class Suffix(Drafter):
    name = "suffix"
    description = STRATEGIES[name].description

    def __init__(self, index: SuffixIndex, tree: bool | None = None) -> None:
        self.index = index
        self.tree = tree
        self.match = 0  # the longest match of the last proposal

    @classmethod
    def build(cls, target, draft=None, tree=None, **options) -> "Suffix":
        return cls(index_for(target), None if tree is None else bool(tree))

    def in_history(self, tokens: torch.Tensor) -> bool:
        """Whether the conversation's last ORDER tokens occur in the earlier answers (a cheap look, for auto:
        what the conversation itself holds, prompt lookup finds)."""
        return self.index.occurrences(tokens[-ORDER:].numpy()).size > 0

    def reset(self) -> None:
        """A new answer: the corpus follows the history first (a deleted chat's answers leave it)."""
        self.index.sync()

    def finished(self, tokens: torch.Tensor, prompt_len: int) -> None:
        """The answer joins the corpus, with its prompt's last tokens."""
        if tokens.shape[0] > prompt_len:
            self.index.add(tokens[max(0, prompt_len - PROMPT_TAIL) :].numpy())

    def leaving_out(self, answers: list[list[int]]):
        return self.index.hiding(answers)

    def candidates(self, tokens: torch.Tensor) -> _Tree | None:
        """The tree of continuations of the conversation's last tokens, or None where they occur nowhere."""
        ctx = tokens.numpy()
        if ctx.shape[0] <= ORDER:
            return None
        tail = ctx[-MAX_MATCH:]
        back = np.arange(tail.shape[0])  # how far back a match is followed: MAX_MATCH at most
        found = []  # (source, ends, match lengths)
        ends = self.index.occurrences(tail)
        if ends.size:
            found.append((self.index.visible, ends, agreement(self.index.visible, ends, tail, back)))
        here = np.flatnonzero(ctx[ORDER - 1 : ctx.shape[0] - 1] == ctx[-1]) + ORDER - 1  # earlier, in the conversation
        if here.size:
            here = here[-MAX_OCCURRENCES:]
            lengths = agreement(ctx, here, tail, back)
            keep = lengths >= ORDER
            if keep.any():
                found.append((ctx, here[keep], lengths[keep]))
        if not found:
            return None
        longest = max(int(lengths.max()) for _, _, lengths in found)
        self.match = longest
        tree = _Tree()
        for source, ends, lengths in found:
            for end, n in zip(ends.tolist(), lengths.tolist()):
                if 2 * n >= longest:
                    tree.add(source[end + 1 : end + 1 + MAX_MATCH], float(n))
        return tree

    def propose(self, ctx: DraftContext, k: int) -> Draft:
        tree = self.candidates(ctx.tokens)
        if tree is None or k <= 0:
            return empty_draft()
        budget = min(k, max(2, round(SPEC_FACTOR * self.match)))
        if sends_tree(self.tree, ctx.target):
            tokens, parents = tree.best(budget)
            if not tokens:
                return empty_draft()
            return Draft(torch.tensor(tokens, dtype=torch.long), tree=TokenTree.of_draft(parents))
        return Draft(torch.tensor(tree.chain(budget), dtype=torch.long))


_INDEXES: dict[str, SuffixIndex] = {}
_APART = False  # each drafter its own empty corpus in memory (keep_apart)


def keep_apart() -> None:
    """From now on in this process every drafter made starts from its own empty corpus, kept in memory only:
    the bench measures each strategy on what it has said itself in the run, never on another strategy's
    answers to the same prompt or on what an earlier run left."""
    global _APART
    _APART = True


def index_for(target) -> SuffixIndex:
    """The model's corpus, one per model in a process (the strategy and auto's member share it), read from
    DATA_DIR/suffix/ where an earlier session left it; a model without a fingerprint keeps it in memory."""
    from ..api.paths import conversations_db, corpus_dir
    from ..heads.store import fingerprints

    if _APART:
        return SuffixIndex()
    prints = fingerprints(target)
    key = prints[0] if prints is not None else f"memory-{id(target)}"
    if key not in _INDEXES:
        if not _INDEXES:
            atexit.register(save_all)
        path = corpus_dir() / f"{key[:32]}.npz" if prints is not None else None
        index = SuffixIndex(path, conversations_db() if path is not None else None, getattr(target, "tokenizer", None))
        damaged = bool(index.note)
        index.sync()  # a new model, a lost or damaged corpus, or chats deleted since it was written: from the history
        if index.note:
            (log.warning if damaged else log.info)("%s", index.note)
        _INDEXES[key] = index
    return _INDEXES[key]


def save_all() -> None:
    """Write every corpus with answers not yet saved (at the end of a process)."""
    for index in _INDEXES.values():
        if index._unsaved:
            index.save()
