"""The target's features that a head trains on, extracted once with the engine's own forward: its final
hidden states over a conversation (EAGLE-1/2, Medusa), or the states entering the layers an EAGLE-3 head reads
over the answer and the EAGLE3_CONTEXT prompt positions before it, with the target's most likely next tokens
(its soft labels). Stored one file per conversation and read back memory-mapped; features kept while the
answers were made by batched decoding (`decoding.batched`) are laid out the same way."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .answers import Answer

EAGLE3_CONTEXT = 256  # an EAGLE-3 head trains over an answer and at most this many prompt positions before it
TARGET_TOP = 32  # an EAGLE-3 head learns the target's distribution over its this many most likely next tokens


@dataclass
class Sequence:
    tokens: torch.Tensor  # (T,) prompt and answer
    # (T, D) the target's final hidden states, before its final norm; for an EAGLE-3 head (T, 3D) the states
    # entering the layers it reads
    features: torch.Tensor
    answer_start: int
    # for an EAGLE-3 head: the target's TARGET_TOP most likely next tokens at each position and their
    # probabilities (T, TARGET_TOP), its soft labels
    top_ids: torch.Tensor | None = None
    top_p: torch.Tensor | None = None


def with_features(target, answers: list[Answer], say: Callable[[str], None] = lambda s: None,
                  aux_layers: tuple[int, ...] = (), store: Path | None = None) -> list[Sequence]:
    """The target's features over each conversation, extracted once with the engine's own forward: its
    final hidden states, or with `aux_layers` the states entering those layers (EAGLE-3) over the answer
    and the EAGLE3_CONTEXT prompt positions before it. With `store`, each conversation's features are
    written there once and read back memory-mapped: a resumed run does not compute them again, and features
    larger than the machine's memory stay on disk (2 million answer tokens of EAGLE-3 features are ~18 GB)."""
    out = []
    computed, computing_s = 0, 0.0  # the time left follows the conversations computed, not those read back
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
    for n, a in enumerate(answers, 1):
        seq = stored_sequence(store / f"{n - 1:06d}.pt", target, a, aux_layers) if store is not None else None
        if seq is None:
            t0 = time.perf_counter()
            seq = features_of(target, a.prompt, a.answer, aux_layers)
            if store is not None:
                seq = store_sequence(store / f"{n - 1:06d}.pt", seq)
            computed, computing_s = computed + 1, computing_s + time.perf_counter() - t0
        out.append(seq)
        if n % 20 == 0 or n == len(answers):
            read = f", {n - computed} read from the data folder" if n > computed else ""
            eta = f", eta {computing_s / computed * (len(answers) - n):.0f} s" if computed else ""
            say(f"features: {n}/{len(answers)} conversations{read}{eta}")
    return out


def _read_tokens(target, prompt: list[int], answer: list[int], aux_layers: tuple[int, ...]) -> tuple[torch.Tensor, int]:
    """The tokens the target reads for a conversation (cut at its window) and the first position whose
    features are kept: 0, or for an EAGLE-3 head the EAGLE3_CONTEXT prompt positions before the answer."""
    tokens = torch.tensor(prompt + answer, dtype=torch.long)[: target.context_window]
    return tokens, first_kept(len(prompt)) if aux_layers else 0


def first_kept(prompt_length: int) -> int:
    """The first position whose EAGLE-3 features are kept: EAGLE3_CONTEXT prompt positions before the answer."""
    return max(0, prompt_length - EAGLE3_CONTEXT)


def stored_sequence(path: Path, target, answer: Answer, aux_layers: tuple[int, ...]) -> Sequence | None:
    """A conversation's features stored by an earlier run, memory-mapped; None when there are none, or they
    are of other tokens (another answers file) or unreadable (a run killed while writing)."""
    if not path.is_file():
        return None
    try:
        state = torch.load(path, mmap=True, weights_only=True)
        tokens, first = _read_tokens(target, answer.prompt, answer.answer, aux_layers)
        tokens = tokens[first:]
        width = target.model.config.hidden_size * max(1, len(aux_layers))
        if not torch.equal(state["tokens"], tokens) or state["features"].shape != (tokens.shape[0], width):
            return None
        if aux_layers and "top_ids" not in state:  # stored before the soft labels were: computed again
            return None
        return Sequence(state["tokens"], state["features"], int(state["answer_start"]),
                        state.get("top_ids"), state.get("top_p"))
    except Exception:  # a damaged file of ours: computed again
        return None


def store_sequence(path: Path, seq: Sequence) -> Sequence:
    """Write a conversation's features (whole, then renamed) and return them memory-mapped from the file."""
    tmp = path.with_suffix(".tmp")
    state = {"tokens": seq.tokens, "features": seq.features, "answer_start": seq.answer_start}
    if seq.top_ids is not None:
        state |= {"top_ids": seq.top_ids, "top_p": seq.top_p}
    torch.save(state, tmp)
    tmp.replace(path)
    state = torch.load(path, mmap=True, weights_only=True)
    return Sequence(state["tokens"], state["features"], seq.answer_start, state.get("top_ids"), state.get("top_p"))


def kept_sequence(target, a: Answer, aux_layers: tuple[int, ...], kept: tuple) -> Sequence:
    """An answer's features kept while it was made (`decoding.batched.BatchedDecoder`; `kept`: the states, the
    target's top tokens and their probabilities), as `features_of` lays them out: its last token, never read
    by the target, gets a row of zeros (an EAGLE-3 head's training reads every row but the last)."""
    tokens, first = _read_tokens(target, a.prompt, a.answer, aux_layers)
    feats, ids, probs = kept
    rows = tokens.shape[0] - first
    if feats.shape[0] < rows:
        pad = rows - feats.shape[0]
        feats = torch.cat([feats, feats.new_zeros(pad, feats.shape[1])])
        ids = torch.cat([ids, ids.new_zeros(pad, ids.shape[1])])
        probs = torch.cat([probs, probs.new_zeros(pad, probs.shape[1])])
    return Sequence(tokens[first:], feats[:rows], len(a.prompt) - first, ids[:rows], probs[:rows])


def features_of(target, prompt: list[int], answer: list[int], aux_layers: tuple[int, ...] = ()) -> Sequence:
    """One conversation's features, computed: the target's final hidden states over it, or with `aux_layers`
    the states entering those layers and the target's most likely next tokens from the first kept position."""
    runner = target.new_runner()
    tokens, first = _read_tokens(target, prompt, answer, aux_layers)
    if aux_layers:
        runner.keep_layers(aux_layers)
    if not aux_layers:
        runner.forward(tokens)
        return Sequence(tokens[first:], runner.features(first, runner.length).clone().cpu(), len(prompt) - first)
    # an EAGLE-3 head also learns the target's own next-token distribution at each position it reads
    top_ids, top_p = target_top(runner.forward(tokens, last=tokens.shape[0] - first))
    return Sequence(tokens[first:], runner.aux_features(first, runner.length).clone().cpu(), len(prompt) - first,
                    top_ids, top_p)


def target_top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, V) fp32 logits -> the target's TARGET_TOP most likely tokens (n, TARGET_TOP) int32 and their
    probabilities, fp16: an EAGLE-3 head's soft labels."""
    top = torch.softmax(logits, -1).topk(min(TARGET_TOP, logits.shape[-1]), dim=-1)
    return top.indices.int().cpu(), top.values.half().cpu()
