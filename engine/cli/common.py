"""What the commands share: the backend a command talks to (the local engine, or a server: the same
`Backend` the engine's worker drives for the window and `specula serve`), the decoding settings from the
flags, prompt files and JSON lines."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from ..api.backend import Backend
from ..api.errors import SpeculaError
from ..api.events import Loaded
from ..api.strategies import STRATEGIES, STRATEGY_OPTIONS, default_k, request_options
from ..api.types import DecodeConfig, GenerateRequest, LoadRequest, ModelChoice, RemoteLoadRequest
from ..remote.backend import RemoteBackend
from ..serving.session import Session


@dataclass(frozen=True)
class PromptItem:
    turns: tuple[str, ...]
    question_id: object = None
    category: str | None = None


def json_line(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False)


def model_choice(args, step: str | None = None) -> ModelChoice:
    """The model a command's flags name (--model, --device, --dtype, --weights, --step; `step` in place of the last)."""
    return ModelChoice(args.model, args.device, args.dtype, args.weights, step or args.step)


# the decoding settings a command may leave out of its flags (bench has no --top-p, measure-head no
# --temperature): a command without one decodes with DecodeConfig's own default for it
OPTIONAL_SETTINGS = ("temperature", "top_k", "top_p", "adaptive_k", "seed")


@dataclass(frozen=True)
class Asked:
    """What a decoding command's flags ask, read once at its top: the strategy that answers, the decoding
    settings, the strategy's options, and the load (the local engine's, or a server's)."""

    strategy: str
    config: DecodeConfig
    options: tuple[tuple[str, object], ...]
    load: LoadRequest | RemoteLoadRequest
    chat: bool = True
    k: int | None = None  # --k as given; None: each strategy's own draft length

    @property
    def remote(self) -> bool:
        return isinstance(self.load, RemoteLoadRequest)

    def request(self, messages) -> GenerateRequest:
        """One turn's request."""
        return GenerateRequest(messages, self.strategy, self.config, self.chat, self.options)

    def config_for(self, strategy: str) -> DecodeConfig:
        """The decoding settings for another strategy than the asked one (bench runs several): the same, with
        that strategy's own draft length unless --k gave one."""
        return replace(self.config, k=default_k(strategy) if self.k is None else self.k)


def read_flags(args, measure_baseline: bool = True, prepare: bool = True) -> Asked:
    """The flags read into an Asked; bad numbers and an unusable strategy fail here, before any model loads.
    Every decoding command reads its flags here (generate, chat, bench, measure-head), so a flag means one thing
    with one check everywhere. `prepare`: run an answer like the first as the model loads (off where the
    command warms up on its own, or loads no session)."""
    remote = getattr(args, "backend", "local") == "remote"
    # a command without --strategy (bench, which names the strategies it runs apart; measure-head) asks for plain
    # decoding, the reference each strategy's settings come from; --strategy left out: auto here, and a server
    # speculates as it was started to
    strategy = getattr(args, "strategy", "none")
    if strategy is None:
        strategy = "server" if remote else "auto"
    settings = {name: getattr(args, name) for name in OPTIONAL_SETTINGS if hasattr(args, name)}
    config = DecodeConfig.for_strategy(strategy, args.k, max_new_tokens=args.max_new_tokens, **settings)
    options = request_options({name: getattr(args, name, None) for name in STRATEGY_OPTIONS})
    if remote:
        return Asked("server", config, options, _remote_request(args, strategy), k=args.k)  # the server speaks chat
    check_strategy(strategy, args.draft_model)
    chat = getattr(args, "chat", True)
    # the first answer at the speed of the next: one like it is run as the model loads
    first = GenerateRequest((), strategy, config, chat, options) if prepare else None
    load = LoadRequest(model_choice(args), args.draft_model, measure_baseline=measure_baseline,
                       draft_head=getattr(args, "draft_head", None), prepare=first)
    return Asked(strategy, config, options, load, chat, args.k)


def check_strategy(strategy: str, draft_model: str | None) -> None:
    if strategy not in STRATEGIES:
        raise SpeculaError(f"unknown strategy '{strategy}': choose one of {', '.join(STRATEGIES)}")
    if STRATEGIES[strategy].needs_draft_model and not draft_model:
        raise SpeculaError(f"strategy '{strategy}' needs --draft-model")


def _remote_request(args, strategy: str) -> RemoteLoadRequest:
    """A server's connection as the command line says (--server, --server-model, --api-key-env, ...)."""
    if not args.server:
        raise SpeculaError("--backend remote needs --server URL (e.g. http://127.0.0.1:8011)")
    if strategy not in ("none", "server") or args.draft_model or args.model != "bundled":
        raise SpeculaError("with --backend remote the server chooses the model's speculation: use --server-model "
                           "instead of --model, and drop --strategy and --draft-model")
    return RemoteLoadRequest(args.server, args.server_model or "", args.api_key_env or "", args.baseline_server or "",
                             verify_tls=not args.insecure, allow_http_key=args.allow_http_key)


def read_prompts(path: Path) -> list[PromptItem]:
    """JSON Lines with either "prompt" (one turn) or Spec-Bench's "turns" (several)."""
    if path.is_dir():
        raise SpeculaError(f"{path} is a folder, not a prompts file: give a JSON Lines file, one prompt per line")
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
        except RecursionError:  # Python's reader stops at about a thousand levels
            raise SpeculaError(f"{path} line {number}: not valid JSON (nested too deeply)") from None
        turns = row.get("turns") if isinstance(row, dict) else None
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            turns = [row["prompt"]]
        if not turns or not isinstance(turns, list) or not all(isinstance(t, str) for t in turns):  # "abc": no list
            raise SpeculaError(f'{path} line {number}: needs a "prompt" string or a "turns" list of strings')
        if not all(t.strip() for t in turns):
            raise SpeculaError(f"{path} line {number}: the prompt is empty")
        items.append(PromptItem(tuple(turns), row.get("question_id"), row.get("category")))
    if not items:
        raise SpeculaError(f"{path} holds no prompts")
    return items


def open_backend(asked: Asked, progress) -> tuple[Backend, Loaded]:
    """The backend the flags ask for, loaded: a server (--backend remote) or the local engine with the
    model, whose strategy is built once here so that an unusable one fails before any answer."""
    if asked.remote:
        backend = RemoteBackend()
        loaded = backend.load(asked.load, progress)
        if progress is not None:
            for note in loaded.notes:
                progress(note)
        return backend, backend.describe()
    session = Session()
    loaded = session.load(asked.load, progress)
    for warning in loaded.warnings + tuple(text for text in (loaded.dropped_why, loaded.path) if text):
        print(f"specula: note: {warning}", file=sys.stderr)
    session.drafter(asked.strategy, dict(asked.options))
    return session, loaded


def show_reading(event) -> bool:
    """A long prompt being read (a PromptProgress), on one line of standard error that the next replaces;
    None clears it. Returns whether the line is shown."""
    if event is None:
        sys.stderr.write("\r" + " " * 72 + "\r")
        sys.stderr.flush()
        return False
    left = event.left_s
    rest = f", about {max(1, round(left))} s left" if left is not None else ""
    sys.stderr.write(f"\r[reading the prompt: {event.done:,} of {event.total:,} tokens{rest}]".ljust(72))
    sys.stderr.flush()
    return True
