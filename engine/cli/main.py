"""`specula`: the engine without the GUI.

    specula generate --model bundled --strategy prompt-lookup --prompt "..." [--json]
    specula strategies
    specula chat                       an interactive terminal chat with coloured tokens
    specula generate --backend remote --server URL --prompt "..."    through a vLLM (or other) server
    specula serve --model bundled --port 8000    an OpenAI-compatible server (docs/SERVER.md)
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import warnings
from pathlib import Path

from ..api.collector import collected_after
from ..api.errors import SpeculaError, terminal_safe
from ..api.strategies import STRATEGY_OPTIONS
from ..api.types import K_MAX, SEED_MAX, SEED_MIN

EXIT_BAD_INPUT = 2


def whole(low: int, high: int | None = None, note: str = ""):
    """An argparse type: a whole number from `low` (to `high`); argparse names the flag in its error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low or (high is not None and value > high):
            where = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {where}{note}, got {value}")
        return value

    return parse


def number(low: float, high: float | None = None, low_allowed: bool = True):
    """An argparse type: a finite number from `low` (above it where `low_allowed` is false) to `high`."""
    where = (f"from {low:g} to {high:g}" if high is not None else
             f"at least {low:g}" if low_allowed else f"a finite number above {low:g}")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        below = value < low if low_allowed else value <= low
        if not math.isfinite(value) or below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {where}, got {text}")
        return value

    return parse


positive_number = number(0, low_allowed=False)
share = number(0, 1)


SEED = whole(SEED_MIN, SEED_MAX)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="bundled", help="bundled, a Hugging Face Hub id, a folder or a .gguf file")
    p.add_argument("--draft-model", default=None, help="draft model for the draft-model strategy")
    p.add_argument("--draft-head", default=None,
                   help="a draft head for eagle or medusa: a folder (Specula's, or an EAGLE-1/2/3 or Medusa head as "
                        "published) or a Hub id")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    p.add_argument("--weights", default="auto", choices=["auto", "native", "dequantized"],
                   help="a GGUF's 4-bit weights: native runs its Q4_0/Q4_1/Q4_K blocks as they are (CPU, bf16); "
                        "dequantized expands them to --dtype; auto: native where it applies")
    p.add_argument("--step", default="auto", choices=["auto", "compiled", "eager", "static"],
                   help="the decoding step (Llama family). CPU: compiled is built once per machine with the C++ "
                        "compiler and waited for; auto uses it once built (building it in the background); eager never. "
                        "GPU: auto and compiled run steps of fixed shapes over a static cache, captured as CUDA graphs "
                        "in the background; static runs them without graphs; eager as neither")


def _add_remote_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="local", choices=["local", "remote"],
                   help="local: this machine's engine; remote: an OpenAI-compatible server such as vLLM (chat only)")
    p.add_argument("--server", default=None, help="remote: the server's base URL, e.g. http://127.0.0.1:8011")
    p.add_argument("--server-model", default=None, help="remote: a model the server lists (default: its first)")
    p.add_argument("--api-key-env", default=None,
                   help="remote: the environment variable holding the API key (default: the OS keyring's, else none)")
    p.add_argument("--baseline-server", default=None,
                   help="remote: the same model served without speculation; its measured speed gives the speedup")
    p.add_argument("--insecure", action="store_true", help="remote: do not verify the server's TLS certificate")
    p.add_argument("--allow-http-key", action="store_true",
                   help="remote: send the API key over plain http:// to a host that is not this machine (unencrypted)")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strategy", default=None, help="a name from `specula strategies` (default: auto)")
    p.add_argument("--k", type=int, default=None,
                   help="longest draft (start value with --adaptive-k); default: the strategy's own, see `specula strategies`")
    p.add_argument("--adaptive-k", action="store_true", help="grow k after full acceptance, shrink after rejection")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=SEED, default=None,
                   help="sampling: the same seed repeats an answer (default: a fresh one each time)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--chat", action="store_true", help="apply the model's chat template")
    p.add_argument("--system", default=None, help="system prompt (with --chat)")
    for option in STRATEGY_OPTIONS.values():  # the strategies' options, from their one schema
        if not option.on_command_line:
            continue
        if option.switch:
            p.add_argument(option.flag, action=argparse.BooleanOptionalAction, default=None, help=option.help)
        else:
            p.add_argument(option.flag, type=option.kinds[0], default=None, help=option.help)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        self.exit(EXIT_BAD_INPUT, f"specula: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specula", description="Speculative decoding for local models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    g = sub.add_parser("generate", help="generate from a prompt or a JSON Lines file of prompts")
    _add_model_args(g)
    _add_remote_args(g)
    _add_decode_args(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompts", type=Path, help='JSON Lines with "prompt" or Spec-Bench "turns"')
    g.add_argument("--json", action="store_true", help="one JSON object per prompt per line")
    b = sub.add_parser("bench", help="every strategy and peer on the same prompts, interleaved")
    _add_model_args(b)
    b.add_argument("--prompts", type=Path, required=True, help="JSON Lines (Spec-Bench format)")
    b.add_argument("--categories", default=None, help="comma-separated categories to keep")
    b.add_argument("--limit-per-category", type=whole(1), default=None)
    b.add_argument("--strategies", default="none,prompt-lookup", help="comma-separated strategy names")
    b.add_argument("--peers", default="",
                   help="comma-separated: hf, hf-prompt-lookup, hf-assisted, and servers as NAME=URL "
                        "(e.g. vllm=http://127.0.0.1:8011,vllm-plain=http://127.0.0.1:8012)")
    b.add_argument("--api-key-env", default=None, help="server peers: the environment variable holding the API key")
    b.add_argument("--insecure", action="store_true", help="server peers: do not verify TLS certificates")
    b.add_argument("--allow-http-key", action="store_true",
                   help="server peers: send the API key over plain http:// to other hosts (unencrypted)")
    # no --strategy (the strategies benched are --strategies: read_flags asks for none, the reference, and each gets
    # its own settings from it) and no --seed: a sampled run draws afresh, as a user's answer does (a seed keeps
    # timings from shaping the steps: the draft model would draft its whole length every step)
    b.add_argument("--max-new-tokens", type=int, default=96)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--k", type=int, default=None, help="longest draft for every strategy; default: each strategy's own")
    b.add_argument("--adaptive-k", action="store_true")
    b.add_argument("--no-chat", dest="chat", action="store_false", help="raw prompts instead of the chat template")
    b.add_argument("--head", default=None, help="a draft head folder for the eagle strategy")
    b.add_argument("--repeat", type=int, default=1)
    b.add_argument("--out", type=Path, default=None, help="folder for bench.md, bench.json, trace.jsonl (per prompt), steps.jsonl (per step) and PNG charts")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    t = sub.add_parser("train-head", help="train a draft head for a model on its own answers (self-distillation)")
    _add_model_args(t)
    t.add_argument("--kind", default="eagle", choices=["eagle", "eagle3", "medusa", "phrases"],
                   help="phrases: no head, the model's own phrases counted from --data's answers (auto drafts them)")
    t.add_argument("--tokens", type=whole(100), default=20000, help="answer tokens to generate for training")
    t.add_argument("--epochs", type=whole(1), default=2)
    t.add_argument("--lr", type=positive_number, default=1e-3)
    t.add_argument("--max-new-tokens", type=whole(1), default=192, help="longest training answer")
    t.add_argument("--seed", type=SEED, default=0)
    t.add_argument("--draft-vocab", type=whole(0, note=" (0: the whole vocabulary)"), default=8192,
                   help="the head drafts only the V most frequent answer tokens (0: the whole vocabulary)")
    t.add_argument("--model-questions", dest="written", type=share, default=None, metavar="SHARE",
                   help="of the first turns without a long pasted text, the share the model writes itself as a user "
                        "would ask (0 to 1; default 0.25); the generator's kinds make the rest")
    t.add_argument("--batch", type=whole(1), default=32,
                   help="prompts answered together while generating training data")
    t.add_argument("--train-batch", type=whole(1), default=4, help="conversations per optimizer step")
    t.add_argument("--data", type=Path, default=None,
                   help="folder for the generated answers and training checkpoints (default: OUT/training); "
                        "a run with the same folder resumes, and another kind of head can reuse its answers")
    t.add_argument("--out", type=Path, default=None,
                   help="folder for head.safetensors and head.json (default: the user's heads folder, where "
                        "the app and `generate` find it for this model)")
    t.add_argument("--overwrite", action="store_true")
    t.add_argument("--from", dest="start", type=Path, default=None, metavar="HEAD",
                   help="continue training this head (of the same kind, made for this model) on these answers: its "
                        "weights and draft vocabulary are the start (use a lower --lr, e.g. 3e-4)")
    m = sub.add_parser("measure-head", help="the draft heads' mean accepted length on prompts, drafting a chain at "
                                            "every step (no cost model): what a head knows, the same on any machine")
    _add_model_args(m)
    m.add_argument("--head", dest="heads", metavar="HEAD", action="append", default=None,
                   help="a head folder (repeat for several); default: every eagle and medusa head found for the model")
    m.add_argument("--prompts", type=Path, required=True,
                   help="JSON Lines (Spec-Bench format): each prompt's first turn; or a train-head data folder: the "
                        "first turns of its held-out tenth, by kind (written by the model, generated)")
    m.add_argument("--categories", default=None, help="comma-separated categories to keep")
    m.add_argument("--limit-per-category", type=whole(1), default=None)
    # no --strategy: the answers it measures on are plain decoding's (read_flags asks for none)
    m.add_argument("--max-new-tokens", type=int, default=96)
    m.add_argument("--k", type=int, default=5, help="the chain's length (a tree's depth)")
    m.add_argument("--tree-nodes", type=whole(0, K_MAX), default=0,
                   help="also measure EAGLE heads as the eagle drafter's dynamic trees of this many nodes (0: chains only)")
    m.add_argument("--no-chat", dest="chat", action="store_false", help="raw prompts instead of the chat template")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    st = sub.add_parser("strategies", help="list the draft strategies (with --model: which ones that model can use)")
    st.add_argument("--model", default=None, help="load this model and mark the strategies it can use, with the heads found")
    st.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "mps"])
    st.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    st.add_argument("--weights", default="auto", choices=["auto", "native", "dequantized"])
    e = sub.add_parser("export", help="write a model as a safetensors folder for a serving engine (vLLM)")
    e.add_argument("--model", default="bundled", help="bundled, a .gguf file or a model folder")
    e.add_argument("--out", type=Path, required=True, help="the folder to write")
    e.add_argument("--overwrite", action="store_true")
    sv = sub.add_parser("serve", help="serve the engine as an OpenAI-compatible HTTP server (docs/SERVER.md)")
    _add_model_args(sv)
    sv.add_argument("--strategy", default="auto",
                    help="the strategy of requests that name none (their 'specula' extension may pick another)")
    sv.add_argument("--k", type=int, default=None, help="draft length of requests that name none")
    sv.add_argument("--host", default="127.0.0.1", help="the address to listen on (another than loopback needs a key)")
    sv.add_argument("--port", type=whole(0, 65535), default=8000, help="0: any free port (printed)")
    sv.add_argument("--api-key-env", default=None, help="the environment variable holding the key clients must send")
    sv.add_argument("--data-dir", default=None, metavar="DIR",
                    help="where the server keeps what it learns from its answers (the earlier answers the drafters "
                         "read, the phrases); default: the user's data folder. An empty folder starts apart from earlier "
                         "runs, as a measurement should")
    sv.add_argument("--no-baseline", action="store_true", help="skip measuring plain decoding when the model loads")
    sv.add_argument("--no-model", action="store_true", help="start without a model (load one with POST /specula/v1/load)")
    sv.add_argument("--announce", action="store_true",
                    help='print {"url": ...} on a line of standard output once listening (for a parent process)')
    sv.add_argument("--exit-with-parent", action="store_true", help="end when the process that started this one ends")
    sv.add_argument("--max-queue", type=whole(1, 100000), default=16,
                    help="generation requests that may wait behind the running one; more get 429 (default 16)")
    sv.add_argument("--max-body-mb", type=float, default=4.0, help="the largest request body accepted, in MiB (default 4)")
    sv.add_argument("--allow-server", action="append", default=[], metavar="URL",
                    help="a server that POST /specula/v1/load may relay without an API key (repeatable)")
    sv.add_argument("--allow-key-env", action="append", default=[], metavar="VAR",
                    help="an environment variable a load request may name as a relayed server's key (repeatable)")
    sub.add_parser("build-step", help="build the compiled decoding step for this CPU now (make setup runs it)")
    c = sub.add_parser("chat", help="chat in the terminal")
    _add_model_args(c)
    _add_remote_args(c)
    _add_decode_args(c)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not os.environ.get("SPECULA_DEBUG"):
        _quiet_libraries()
    try:
        if args.command == "strategies":
            return _strategies(args)
        with collected_after(freeze=True):  # the command's modules: torch, transformers
            run = _subcommand(args.command)
        return run(args)
    except SpeculaError as exc:
        print(f"specula: error: {terminal_safe(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("specula: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # no traceback for users; SPECULA_DEBUG=1 shows it
        if os.environ.get("SPECULA_DEBUG"):
            raise
        from ..serving.worker import describe_error

        print(f"specula: error: {terminal_safe(describe_error(exc))}", file=sys.stderr)
        return 1
    return 0


def _subcommand(name: str):
    """The function that runs a subcommand; its module is imported only then, so that `specula --help` and
    `specula strategies` load no torch."""
    if name == "generate":
        from .generate import run_generate as run
    elif name == "bench":
        from .bench.command import run_bench_cmd as run
    elif name == "chat":
        from .chat import run_chat as run
    elif name == "export":
        from .export import run_export as run
    elif name == "serve":
        from .serve import run_serve as run
    elif name == "measure-head":
        from .measure import run_measure_head as run
    elif name == "build-step":
        from .build import run_build_step as run
    else:
        from .train import run_train_cmd as run
    return run


def _strategies(args) -> int:
    from ..drafters import DRAFTERS

    if args.model is None:
        for name, info in DRAFTERS.items():
            print(f"{name}\t{info.description} (default k {info.default_k})")
        return 0
    from ..api.types import LoadRequest
    from ..serving.session import Session
    from .common import model_choice

    session = Session()
    loaded = session.load(LoadRequest(model_choice(args, step="eager"), measure_baseline=False))
    print(f"strategies for {loaded.target}:")
    for name, info in DRAFTERS.items():
        if name in loaded.strategies:
            heads = session.heads.get(info.needs_head, []) if info.needs_head else (
                [f[0] for f in session.heads.values()] if info.uses_heads else [])
            where = f" (head: {heads[0]})" if info.needs_head and heads else (
                f" (heads: {', '.join(str(h) for h in heads)})" if heads else "")
            print(f"{name}\tavailable{where}")
        elif info.needs_draft_model:
            print(f"{name}\tneeds --draft-model")
        else:
            article = "an" if info.needs_head[0] in "aeiou" else "a"
            print(f"{name}\tneeds {article} {info.needs_head} head trained for this model (`specula train-head --kind {info.needs_head}`)")
    return 0


def _quiet_libraries() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
