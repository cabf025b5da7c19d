"""`specula generate`: one model load, then every prompt (and every turn) in one process."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .cli import json_line
from .decoder import DecodeConfig
from .drafters import DRAFTERS, default_k
from .errors import SpeculaError, terminal_safe
from .events import Finished, Step
from .loading import ModelSpec
from .metrics import SpeedupSum, speedup_text
from .prompts import Message, conversation
from .sampling import SamplingParams
from .session import GenerateRequest, LoadRequest, Session


@dataclass(frozen=True)
class PromptItem:
    turns: tuple[str, ...]
    question_id: object = None
    category: str | None = None


def decode_config(args) -> DecodeConfig:
    if args.strategy is None:  # the default: auto here; a server speculates as it was started to
        args.strategy = "server" if args.backend == "remote" else "auto"
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    return DecodeConfig(
        k=default_k(args.strategy) if args.k is None else args.k, adaptive_k=args.adaptive_k, max_new_tokens=args.max_new_tokens, params=params, seed=args.seed
    )


def strategy_options(args) -> tuple[tuple[str, object], ...]:
    names = ("min_n", "max_n", "exit_layer", "head", "tree")
    return tuple((n, getattr(args, n)) for n in names if getattr(args, n, None) is not None)


def check_strategy(args) -> None:
    if args.strategy not in DRAFTERS:
        raise SpeculaError(f"unknown strategy '{args.strategy}': choose one of {', '.join(DRAFTERS)}")
    if DRAFTERS[args.strategy].needs_draft_model and not args.draft_model:
        raise SpeculaError(f"strategy '{args.strategy}' needs --draft-model")


def read_prompts(path: Path) -> list[PromptItem]:
    """JSON Lines with either "prompt" (one turn) or Spec-Bench's "turns" (several)."""
    if not path.is_file():
        raise SpeculaError(f"prompts file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8-sig")  # a byte-order mark from an editor is fine
    except UnicodeDecodeError as exc:
        raise SpeculaError(f"{path} is not UTF-8 text (byte {exc.start}): JSON Lines, one prompt per line") from None
    except OSError as exc:
        raise SpeculaError(f"cannot read the prompts file {path}: {exc.strerror or exc}") from None
    items = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpeculaError(f"{path} line {number}: not valid JSON ({exc.msg})") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            turns = [row["prompt"]]
        if not turns or not all(isinstance(t, str) for t in turns):
            raise SpeculaError(f'{path} line {number}: needs a "prompt" string or a "turns" list of strings')
        if not all(t.strip() for t in turns):
            raise SpeculaError(f"{path} line {number}: the prompt is empty")
        items.append(PromptItem(tuple(turns), row.get("question_id"), row.get("category")))
    if not items:
        raise SpeculaError(f"{path} holds no prompts")
    return items


def run_generate(args) -> int:
    config = decode_config(args)  # bad numbers fail before any model loads
    items = [PromptItem((args.prompt,))] if args.prompt is not None else read_prompts(args.prompts)
    if args.backend == "remote":
        session = connect_remote(args, _progress(args))
        args.chat, args.strategy = True, "server"  # the server speaks chat and speculates as it was told
    else:
        check_strategy(args)
        session = Session()
        spec = ModelSpec(args.model, args.device, args.dtype, args.weights, args.step)
        loaded = session.load(LoadRequest(spec, args.draft_model, measure_baseline=False), _progress(args))
        for warning in loaded.warnings:
            print(f"specula: note: {warning}", file=sys.stderr)
        session.drafter(args.strategy, dict(strategy_options(args)))  # unusable strategy: fail before generating
    failures = 0
    for item in items:
        try:
            record = answer(session, item, args, config)
        except SpeculaError as exc:
            failures += 1
            where = f"prompt {item.question_id}: " if item.question_id is not None else ""
            print(f"specula: error: {where}{terminal_safe(str(exc))}", file=sys.stderr)
            continue
        if args.json:
            print(json_line(record), flush=True)
    return 2 if failures else 0


def connect_remote(args, progress):
    """A RemoteBackend connected as the command line says (--server, --server-model, --api-key-env, ...)."""
    from .remote.backend import RemoteBackend, RemoteLoadRequest

    if not args.server:
        raise SpeculaError("--backend remote needs --server URL (e.g. http://127.0.0.1:8011)")
    if args.strategy not in ("none", "server") or args.draft_model or args.model != "bundled":
        raise SpeculaError("with --backend remote the server chooses the model's speculation: use --server-model "
                           "instead of --model, and drop --strategy and --draft-model")
    backend = RemoteBackend()
    request = RemoteLoadRequest(args.server, args.server_model or "", args.api_key_env or "",
                                args.baseline_server or "", verify_tls=not args.insecure,
                                allow_http_key=args.allow_http_key)
    loaded = backend.load(request, progress)
    if progress is not None:
        for note in loaded.notes:
            progress(note)
    return backend


def _progress(args):
    if args.json:
        return None
    return lambda text: print(f"[{text}]", file=sys.stderr, flush=True)


def answer(session: Session, item: PromptItem, args, config: DecodeConfig) -> dict:
    """Run every turn of one prompt; each later turn follows the model's own previous answer."""
    history: tuple[Message, ...] = ()
    turns: list[Finished] = []
    for text in item.turns:
        messages = conversation(text, args.system, history)
        request = GenerateRequest(messages, args.strategy, config, args.chat, strategy_options(args))
        finished = _run_turn(session, request, stream=not args.json)
        turns.append(finished)
        history = messages[1 if args.system else 0 :] + (Message("assistant", finished.text),)
    return _record(item, args.strategy, turns)


def _run_turn(session: Session, request: GenerateRequest, stream: bool) -> Finished:
    finished = None
    for event in session.generate(request):
        if stream and isinstance(event, Step):
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
        speed = f", {speedup_text(finished.speedup, finished.speedup_err)} vs plain" if finished.speedup else ""
        print(file=sys.stdout)
        print(
            f"[{request.strategy}: {t.new_tokens} tokens, {t.tokens_per_s:.1f} tok/s, acceptance {rate}{where}, "
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
        new = sum(f.totals.new_tokens for f in fs)
        forwards = sum(f.totals.target_forwards for f in fs)
        drafted = sum(f.totals.drafted for f in fs)
        accepted = sum(f.totals.accepted for f in fs)
        wall = sum(f.totals.wall_s for f in fs)
        prefill = sum(f.totals.prefill_s for f in fs)
        # each turn's first token comes from its prefill; the rate counts the tokens after it
        decode_tokens = new - sum(1 for f in fs if f.totals.new_tokens)
        return {
            "new_tokens": new,
            "steps": sum(f.totals.steps for f in fs),
            "target_forwards": forwards,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": new / forwards if forwards else 0.0,
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
