"""`specula chat`: a terminal chat that colours each token by where it came from.

Commands: /strategy NAME, /k N, /reset, /help, /quit. Ctrl-C stops the current answer.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace

from ..api.backend import Backend
from ..api.errors import ModelFileChanged, SpeculaError, terminal_safe
from ..api.events import Finished, Origin, PromptProgress, Step, tokens_text
from ..api.metrics import speedup_part
from ..api.prompts import Message, conversation
from ..api.types import GenerateRequest
from .common import open_backend, read_flags, show_reading

try:
    import termios
except ImportError:  # Windows: no terminal attributes to set
    termios = None

COLOURS = {
    Origin.DRAFT: "\033[32m",  # green: accepted draft token
    Origin.CORRECTION: "\033[33m",  # yellow: the target's correction
    Origin.BONUS: "\033[36m",  # cyan: the target's bonus token
    Origin.TARGET: "",
}
RESET = "\033[0m"
HELP = "/strategy NAME  /k N  /reset  /quit   (Ctrl-C stops an answer)"


def _paint(step: Step, colour: bool) -> str:
    if not colour:
        return terminal_safe("".join(t.text for t in step.tokens))
    return "".join(f"{COLOURS[t.origin]}{terminal_safe(t.text)}{RESET}" if COLOURS[t.origin] else terminal_safe(t.text)
                   for t in step.tokens)


def run_chat(args) -> int:
    asked = read_flags(args)
    config, strategy = asked.config, asked.strategy
    colour = sys.stdout.isatty()
    say = lambda text: print(f"[{text}]", file=sys.stderr)  # noqa: E731
    backend, loaded = open_backend(asked, say)
    print(f"{loaded.target} on {loaded.device} ({loaded.weights or loaded.dtype}). Strategy: {strategy}. {HELP}")
    if colour:
        print(f"Colours: {COLOURS[Origin.DRAFT]}accepted draft{RESET}, {COLOURS[Origin.CORRECTION]}correction"
              f"{RESET}, {COLOURS[Origin.BONUS]}bonus{RESET}, plain target.")
    if not loaded.chat:
        print("[this model has no chat template (a base model): each message is continued as plain text]")
    history: tuple[Message, ...] = ()
    while True:
        try:
            line = input("\n> ").strip()
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:  # as in a shell: Ctrl-C clears the line, it does not end the chat
            print("\n[Ctrl-C stops an answer; /quit or Ctrl-D leaves]")
            continue
        if not line:
            continue
        if line.startswith("/"):
            name, _, value = line[1:].partition(" ")
            if name in ("quit", "exit", "q"):
                return 0
            if name == "reset":
                history = ()
                print("[conversation cleared]")
            elif name == "strategy" and value.strip():
                if value.strip() in loaded.strategies:
                    strategy = value.strip()
                    print(f"[strategy: {strategy}]")
                else:
                    print(f"[unknown strategy '{terminal_safe(value.strip())}' for this model; it can use: "
                          f"{', '.join(loaded.strategies)}]")
            elif name == "k":
                config = _with_k(config, value.strip())
            else:
                print(f"[{HELP}; strategies: {', '.join(loaded.strategies)}]")
            continue
        messages = conversation(line, args.system, history)
        request = GenerateRequest(messages, strategy, config, loaded.chat, asked.options)
        finished = _reply(backend, request, colour)
        if finished is not None:
            history = messages[1 if args.system else 0 :] + (Message("assistant", finished.text),)


def _with_k(config, value: str):
    """`/k VALUE`: the config with that draft length, said; else the same config and why not (a number out of range
    or none at all, "/k -1" included)."""
    try:
        config = replace(config, k=int(value))
    except SpeculaError as exc:  # out of range
        print(f"[{exc}]")
    except ValueError:  # not a whole number
        print(f"[/k takes the draft length, a whole number (e.g. /k 4), not '{terminal_safe(value[:40])}']")
    else:
        print(f"[k = {config.k}]")
    return config


def _quiet_control_keys(stream=None):
    """Turn off the terminal's echo of control keys (ECHOCTL: "^C") while an answer is written; returns what puts
    it back. Nothing where the input is not a terminal, or on a system without termios (Windows)."""
    if termios is None:
        return lambda: None
    stream = stream or sys.stdin
    try:
        fd = stream.fileno()
        if not os.isatty(fd):
            return lambda: None
        before = termios.tcgetattr(fd)
        quiet = list(before)
        quiet[3] &= ~getattr(termios, "ECHOCTL", 0)
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
    except (OSError, ValueError, AttributeError, termios.error):
        return lambda: None

    def restore() -> None:
        try:
            termios.tcsetattr(fd, termios.TCSANOW, before)
        except (OSError, termios.error):
            pass

    return restore


def _reply(backend: Backend, request: GenerateRequest, colour: bool) -> Finished | None:
    stop = [False]

    def on_interrupt(signum, frame) -> None:
        stop[0] = True  # the loop ends before its next step and still reports what it made

    previous = signal.signal(signal.SIGINT, on_interrupt)
    echo = _quiet_control_keys()  # Ctrl+C stops the answer: the terminal does not write "^C" into it
    finished = None
    try:
        reading = False
        for event in backend.generate(request, should_stop=lambda: stop[0]):
            if isinstance(event, PromptProgress):
                reading = show_reading(event)
            elif isinstance(event, Step):
                if reading:
                    reading = show_reading(None)
                sys.stdout.write(_paint(event, colour))
                sys.stdout.flush()
            elif isinstance(event, Finished):
                finished = event
    except ModelFileChanged:  # the model cannot answer again: the chat ends with the one line saying why
        print()
        raise
    except SpeculaError as exc:
        print(f"\n[error: {terminal_safe(str(exc))}]")
        return None
    finally:
        signal.signal(signal.SIGINT, previous)
        echo()
    t = finished.totals
    rate = f"{t.acceptance_rate:.0%}" if t.acceptance_rate is not None else "n/a"
    if request.strategy == "server" and t.acceptance_rate is not None:
        rate += " (server-wide counters)"
    speed = f", {speedup_part(finished.speedup, finished.speedup_err)}" if finished.speedup else ""
    print(f"\n[{request.strategy}: {tokens_text(t)}, acceptance {rate}"
          f"{speed}, {finished.reason}]")
    return finished
