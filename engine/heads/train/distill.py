"""Self-distillation's answers: the target answers the generated prompts (and second turns on its own answers),
greedily and, a share of the batches, by sampling, until enough answer tokens exist; each answer is appended
to the data folder's file as it is made. On a CPU the engine's own batched plain decoding answers
(`decoding.batched`), keeping an EAGLE-3 head's features as it goes; elsewhere transformers' generate()."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Callable

import torch

from ...api.prompts import Message, encode
from ...api.types import SamplingParams
from ...decoding.batched import BatchedDecoder, Kept, LoopDecoder
from ...decoding.drafter import Drafter
from ...models.compiled import step_rows
from .answers import Answer, answer_line, drop_torn_tail, read_answers
from .features import first_kept, kept_sequence, store_sequence, target_top
from .prompts import (
    FOLLOW_UPS,
    MODEL_QUERY,
    QUERY_SAMPLING,
    QUERY_SEEDS,
    QUERY_TOKENS,
    prompt_conversations,
    query_prefix,
    usable_query,
)

SAMPLED_SHARE = 0.3  # of batches, how many are answered by sampling (temperature 0.8, top-p 0.95) instead of greedily
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "top_k": 0}
FOLLOW_UP_SHARE = 0.5  # of first answers, how many get a second turn (multi-turn training data)
ANSWER_ROWS = 16  # answers decoded together by batched plain decoding on a CPU (measured in docs/HEADS.md)


def batched_answers(target, drafter: Drafter | None, rows: int, aux_layers: tuple[int, ...] = ()) -> BatchedDecoder:
    """The CPU's answers: batched plain decoding through the compiled step (`models.compiled.step_rows`), one
    conversation at a time through the loop with `drafter` (none: plain steps) until that step runs. With
    `aux_layers`, an EAGLE-3 head's features of each answer are kept as it is made (`features.kept_sequence`)."""
    kept = Kept(tuple(aux_layers), first_kept, target_top) if aux_layers else None
    return BatchedDecoder(target, step_rows, rows, LoopDecoder(target, drafter), kept)


def self_distill(target, n_tokens: int, max_new: int = 192, batch: int = 8, seed: int = 0,
                 say: Callable[[str], None] = lambda s: None, store: Path | None = None,
                 should_stop: Callable[[], bool] = lambda: False, sampled: float = SAMPLED_SHARE,
                 drafter: Drafter | None = None, aux_layers: tuple[int, ...] = (),
                 features: Path | None = None, written: float | None = None) -> list[Answer]:
    """The target answers generated prompts, batched, until about n_tokens answer tokens exist: greedily, and
    a `sampled` share of the batches by sampling (a seed per batch). With `store` (a .jsonl file) every
    answer is appended as it is made, and a later run with the same file continues where this one stopped.
    `drafter`: the strategy the engine's own decoding uses on a CPU (none: plain steps). With `aux_layers` and
    a `features` folder, an EAGLE-3 head's features of each answer made by batched decoding are written there
    as it is made (as `with_features` stores them, which then reads them instead of computing them).
    `written`: the share of first turns without a long text that the model writes itself (prompt_conversations)."""
    tok = target.tokenizer
    # on a CPU the engine's own decoding answers: batched plain decoding through the compiled step (one
    # conversation at a time with the caller's drafter until that step runs); GPUs batch through generate()
    engine = None
    if target.device.type == "cpu" and target.uses_lean_forward:
        engine = batched_answers(target, drafter, min(batch, ANSWER_ROWS), aux_layers if features else ())
        if features is not None:
            features.mkdir(parents=True, exist_ok=True)
    answers = read_answers(store)
    made = sum(len(a.answer) for a in answers)
    convs = prompt_conversations(max(1, 4 * n_tokens // max_new + 8), seed, written=written)
    rng = random.Random(seed + 1 + len(answers))
    i = max((a.index for a in answers), default=-1) + 1
    if made:
        say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens from {store}")
    if made < n_tokens:
        say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens, "
            f"the model is answering a first batch of {batch} prompts")
    if store is not None:
        drop_torn_tail(store)
    sink = store.open("a", encoding="utf-8") if store is not None else None
    t0, made_here = time.perf_counter(), 0
    follow: list[tuple[tuple[Message, ...], int]] = []
    asked: set[str] = set()  # the questions the model wrote in this run (one written twice is dropped)
    model_written: set[int] = set()  # the conversations whose first turn the model wrote
    try:
        while made < n_tokens and (i < len(convs) or follow):
            n_follow = min(len(follow), batch // 2)  # second turns mixed in as soon as their first answers exist
            group = follow[:n_follow]
            del follow[:n_follow]
            fresh = [(c, i + j) for j, c in enumerate(convs[i : i + batch - n_follow])]
            i += len(fresh)
            if any(c[0].content == MODEL_QUERY for c, _ in fresh):
                fresh = write_queries(target, engine, fresh, QUERY_SEEDS + seed * 1_000_003 + i, asked, model_written,
                                      should_stop)
            encoded = []
            for conv, index in group + fresh:
                e = encode(tok, list(conv), True)
                if len(e) + max_new <= target.context_window:
                    encoded.append((conv, index, e))
            if not encoded:
                continue
            batch_seed = seed * 1_000_003 + i
            sampling = random.Random(batch_seed).random() < sampled
            rows = continuations(target, engine, [e for _, _, e in encoded], max_new, sampling, batch_seed, should_stop)
            if should_stop():
                say("")  # a cut batch is dropped; the caller's say raises
                break
            for j, ((conv, index, e), row) in enumerate(zip(encoded, rows)):
                answer = []
                for t in row:
                    if t in target.eos_ids:
                        break
                    answer.append(t)
                if len(answer) < 4:
                    continue
                a = Answer(e, answer, index if len(conv) == 1 else -1, len(conv) == 1 and index in model_written)
                answers.append(a)
                if engine is not None and j in engine.features:
                    kept = kept_sequence(target, a, aux_layers, engine.features[j])
                    store_sequence(features / f"{len(answers) - 1:06d}.pt", kept)
                if sink is not None:
                    sink.write(answer_line(a))
                made += len(answer)
                made_here += len(answer)
                if len(conv) == 1 and rng.random() < FOLLOW_UP_SHARE:  # a second turn on the model's own answer
                    reply = Message("assistant", tok.decode(answer, skip_special_tokens=True))
                    follow.append(((*conv, reply, Message("user", rng.choice(FOLLOW_UPS))), -1))
            if sink is not None:
                sink.flush()
            rate = made_here / max(1e-9, time.perf_counter() - t0)
            eta = (n_tokens - made) / max(1e-9, rate)
            say(f"answers: {min(made, n_tokens)}/{n_tokens} tokens ({rate:.0f} tokens/s, eta {max(0, eta):.0f} s)")
    finally:
        if sink is not None:
            sink.close()
    return answers


def continuations(target, engine: BatchedDecoder | None, prompts: list[list[int]], max_new: int, sampling: bool,
                  seed: int, should_stop: Callable[[], bool], how: dict = SAMPLING,
                  keep: bool = True) -> list[list[int]]:
    """Each prompt's continuation (greedy, or drawn with `how`'s temperature and top-p), up to max_new tokens
    and its end token: through `engine` (the CPU's batched decoding; with `keep`, features kept) or, without
    one, transformers' generate() in one padded batch."""
    if engine is not None:
        params = SamplingParams(how["temperature"], 0, how["top_p"]) if sampling else SamplingParams()
        return engine.answer(prompts, max_new, params, seed, should_stop, keep)
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else sorted(target.eos_ids)[0]
    width = max(len(e) for e in prompts)
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in prompts], device=target.device)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in prompts], device=target.device)
    if sampling:
        torch.manual_seed(seed)
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=mask, max_new_tokens=max_new, pad_token_id=pad,
                                    eos_token_id=sorted(target.eos_ids), stopping_criteria=[_Stop(should_stop)],
                                    **({"do_sample": True, "top_k": 0, **how} if sampling else {"do_sample": False}))
    return out[:, width:].tolist()


def write_queries(target, engine: BatchedDecoder | None, fresh: list, seed: int, asked: set[str],
                  written_ids: set[int], should_stop: Callable[[], bool]) -> list:
    """`fresh` (conversation, index) with each MODEL_QUERY turn written by the model (sampled from its chat
    template opened at a user's turn; the question joins `asked`, its conversation's index `written_ids`); a
    question that is not usable drops its conversation."""
    tok = target.tokenizer
    prefix = query_prefix(tok)
    wanted = [j for j, (c, _) in enumerate(fresh) if c[0].content == MODEL_QUERY]
    written: dict[int, str] = {}
    if prefix is not None and len(prefix) + QUERY_TOKENS <= target.context_window:
        rows = continuations(target, engine, [prefix] * len(wanted), QUERY_TOKENS, True, seed, should_stop,
                             QUERY_SAMPLING, keep=False)
        for j, row in zip(wanted, rows):
            ends = [n for n, t in enumerate(row) if t in target.eos_ids]
            cut = row[: ends[0]] if ends else row
            ended = bool(ends) or len(row) < QUERY_TOKENS  # one at a time, a row leaves out its end token
            text = tok.decode(cut, skip_special_tokens=True).strip()
            if usable_query(text, ended, asked):
                asked.add(text)
                written_ids.add(fresh[j][1])
                written[j] = text
    return [(c, index) if j not in wanted else ((Message("user", written[j]),), index)
            for j, (c, index) in enumerate(fresh) if j not in wanted or j in written]


class _Stop:
    """Ends a batched generate() as soon as the user cancels."""

    def __init__(self, should_stop: Callable[[], bool]) -> None:
        self.should_stop = should_stop

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.should_stop(), dtype=torch.bool, device=input_ids.device)
