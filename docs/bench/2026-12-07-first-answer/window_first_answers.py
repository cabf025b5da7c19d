"""The first answers after the window starts, offscreen: the real MainWindow and its engine process load a model
(a fresh data folder), then answer N different questions one after the other; each line is one answer: its footer's
live figure, tokens/s, acceptance, and the CPU seconds the window's own process spent while it streamed.

    .venv/bin/python docs/bench/2026-12-07-first-answer/window_first_answers.py bundled auto 3 [--size 1024x700] \
        [--data DIR] [--first 3]

--data: this data folder (kept: a later start reads what this one left) instead of a fresh one; --first: begin at
this question (so that a later start asks questions an earlier one did not).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
QUESTIONS = ["Write a Python function that checks whether a string is a palindrome.",
             "Explain what a hash table is in three sentences.",
             "List five fruits and their colours.",
             "Write a Python function that reverses a linked list.",
             "Explain recursion to a child.",
             "Give three tips for writing clear emails."]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("strategy")
    parser.add_argument("n", type=int)
    parser.add_argument("--size", default="1024x700")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--data", default="")
    parser.add_argument("--first", type=int, default=0)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="specula-first-"))
    data = Path(args.data) if args.data else home / "data"
    os.environ["SPECULA_DATA_DIR"] = str(data)
    from PySide6.QtWidgets import QApplication

    from specula.app.history_db import ConversationDB
    from specula.app.settings import SettingsStore
    from specula.app.window import MainWindow

    app = QApplication([])

    def wait(condition, seconds: float, what: str) -> None:
        end = time.time() + seconds
        while not condition():
            if time.time() > end:
                raise SystemExit(f"timed out waiting for {what}")
            app.processEvents()
            time.sleep(0.005)

    started = time.perf_counter()
    w = MainWindow(SettingsStore(home / "config"), ConversationDB(data / "conversations.db"),
                   overrides={"strategy": args.strategy, "max_new_tokens": args.tokens, "model_source": args.model})
    width, height = (int(v) for v in args.size.split("x"))
    w.resize(width, height)
    w.show()
    w.start()
    wait(lambda: w.state == "ready", 900, "the model")
    print(json.dumps({"ready_s": round(time.perf_counter() - started, 2)}), flush=True)
    replies = []
    w.chat.reply_finished.connect(lambda ok, event: replies.append(event))
    for i, question in enumerate(QUESTIONS[args.first : args.first + args.n]):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        w.chat.new_conversation() if hasattr(w.chat, "new_conversation") else None
        w.send_text(question)
        wait(lambda: len(replies) > i, 600, "the answer")
        done = replies[-1]
        t = done.totals
        print(json.dumps({"i": args.first + i, "live": done.speedup, "live_err": done.speedup_err, "tokens": t.new_tokens,
                          "tokens_per_s": round(t.tokens_per_s, 1), "acceptance": t.acceptance_rate,
                          "first_token_s": round(t.prefill_s, 3), "plain_step_ms":
                          None if done.plain_step_s is None else round(done.plain_step_s * 1000, 2),
                          "window_cpu_s": round(time.process_time() - cpu0, 2),
                          "wall_s": round(time.perf_counter() - wall0, 2)}), flush=True)
    w.close()


if __name__ == "__main__":
    sys.exit(main())
