"""`specula generate`: one model load, then every prompt (and every turn) in one process."""

from __future__ import annotations

import sys

from ..api.backend import Backend
from ..api.errors import SpeculaError, terminal_safe
from ..api.events import Finished, PromptProgress, Step, tokens_text
from ..api.metrics import SpeedupSum, speedup_part, summed
from ..api.prompts import Message, conversation
from ..api.types import GenerateRequest
from .common import Asked, PromptItem, json_line, open_backend, read_flags, read_prompts, show_reading


def run_generate(args) -> int:
    asked = read_flags(args, measure_baseline=False)  # bad numbers fail before any model loads
    if args.prompt is not None and not args.prompt.strip():  # as a prompts file's empty line: before the model loads
        raise SpeculaError("--prompt is empty: give the text to answer")
    items = [PromptItem((args.prompt,))] if args.prompt is not None else read_prompts(args.prompts)
    backend, _ = open_backend(asked, _progress(args))
    failures = 0
    for item in items:
        try:
            record = answer(backend, item, asked, system=args.system, stream=not args.json)
        except SpeculaError as exc:
            failures += 1
            where = f"prompt {item.question_id}: " if item.question_id is not None else ""
            print(f"specula: error: {where}{terminal_safe(str(exc))}", file=sys.stderr)
            continue
        if args.json:
            print(json_line(record), flush=True)
    return 2 if failures else 0


def _progress(args):
    if args.json:
        return None
    return lambda text: print(f"[{text}]", file=sys.stderr, flush=True)


def answer(backend: Backend, item: PromptItem, asked: Asked, system: str | None, stream: bool) -> dict:
    """Run every turn of one prompt; each later turn follows the model's own previous answer."""
    history: tuple[Message, ...] = ()
    turns: list[Finished] = []
    for text in item.turns:
        messages = conversation(text, system, history)
        finished = _run_turn(backend, asked.request(messages), stream)
        turns.append(finished)
        history = messages[1 if system else 0 :] + (Message("assistant", finished.text),)
    return _record(item, asked.strategy, turns)


def _run_turn(backend: Backend, request: GenerateRequest, stream: bool) -> Finished:
    finished = None
    reading = False
    for event in backend.generate(request):
        if stream and isinstance(event, PromptProgress):
            reading = show_reading(event)
        elif stream and isinstance(event, Step):
            if reading:
                reading = show_reading(None)
            sys.stdout.write(terminal_safe("".join(t.text for t in event.tokens)))
            sys.stdout.flush()
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    if stream:
        t = finished.totals
        rate = f"{t.acceptance_rate:.0%}" if t.acceptance_rate is not None else "n/a"
        remote = request.strategy == "server"
        where = " (server-wide counters)" if remote else ""
        per = "tokens/step (from chunks)" if remote else "tokens/forward"
        speed = f", {speedup_part(finished.speedup, finished.speedup_err)}" if finished.speedup else ""
        print(file=sys.stdout)
        print(
            f"[{request.strategy}: {tokens_text(t)}, acceptance {rate}{where}, "
            f"{t.mean_accepted_length:.2f} {per}{speed}, {finished.reason}]",
            file=sys.stderr,
        )
    return finished


def _speedup(fs: list[Finished]) -> dict:
    """The live speedup over a conversation's answers, each weighted by its decode time."""
    total = SpeedupSum()
    for f in fs:
        total.add(f.speedup, f.speedup_err, f.totals.decode_s)
    return {"speedup": total.value, "speedup_err": total.error}


def _record(item: PromptItem, strategy: str, turns: list[Finished]) -> dict:
    def stats(fs: list[Finished]) -> dict:
        t = summed(f.totals for f in fs)
        # each turn's first token comes from its prefill; the rate counts the tokens after it
        decode_tokens = t.new_tokens - sum(1 for f in fs if f.totals.new_tokens)
        wall, prefill = t.wall_s, t.prefill_s
        return {
            "new_tokens": t.new_tokens,
            "steps": t.steps,
            "target_forwards": t.target_forwards,
            "drafted": t.drafted,
            "accepted": t.accepted,
            "acceptance_rate": t.acceptance_rate,
            "mean_accepted_length": t.mean_accepted_length,
            "wall_s": wall,
            "prefill_s": prefill,
            "tokens_per_s": decode_tokens / (wall - prefill) if wall > prefill and decode_tokens > 0 else 0.0,
            **_speedup(fs),
            "finish_reason": fs[-1].reason,
        }

    last = turns[-1]
    record: dict = {}
    if item.question_id is not None:
        record["question_id"] = item.question_id
    if item.category is not None:
        record["category"] = item.category
    record.update(text=last.text, token_ids=list(last.token_ids), strategy=strategy, **stats(turns))
    if len(turns) > 1:
        record["turns"] = [{"text": f.text, "token_ids": list(f.token_ids), **stats([f])} for f in turns]
    return record
