"""The window's own Compare on a real pair, offscreen: the real MainWindow and its engine process load the target
and its draft model, answer one question, then run Compare N times on it; each line is one card's figures.

    .venv/bin/python docs/bench/2026-12-07-live-figures/compare_window.py TARGET.gguf DRAFT.gguf draft-model 4 \
        [--busy]

(DRAFT "-": no draft model; TARGET "bundled": the bundled model.)

--busy runs another program beside it: one core busy 15 s, idle 10 s, over and over (a user's machine).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
QUESTION = ("Write a Python function that checks whether a string is a palindrome, with a docstring and two "
            "examples.")
HOG = "while true; do timeout 15 sh -c 'while :; do :; done'; sleep 10; done"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("strategy")
    parser.add_argument("n", type=int)
    parser.add_argument("--busy", action="store_true")
    args = parser.parse_args()
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
            time.sleep(0.01)

    hog = subprocess.Popen(["bash", "-c", HOG], start_new_session=True) if args.busy else None
    try:
        with tempfile.TemporaryDirectory() as home:
            home = Path(home)
            asked = {"strategy": args.strategy, "max_new_tokens": 128, "model_source": args.target}
            if args.draft != "-":  # "-": no draft model
                asked["draft_source"] = args.draft
            w = MainWindow(SettingsStore(home / "config"), ConversationDB(home / "c.db"), overrides=asked)
            w.resize(1024, 700)
            w.show()
            w.start()
            wait(lambda: w.state == "ready", 900, "the model")
            replies = []
            w.chat.reply_finished.connect(lambda ok, event: replies.append(event))
            w.send_text(QUESTION)
            wait(lambda: replies, 600, "the answer")
            for i in range(args.n):
                done = []
                w.compare.finished.connect(done.append)
                w.compare_last()
                wait(lambda: done, 900, "the comparison")
                w.compare.finished.disconnect()
                c = done[-1]
                print(json.dumps({"i": i, "measured": c.speedup, "live": c.fast.live, "live_err": c.fast.live_err,
                                  "identical": c.identical, "plain_tps": c.plain.tokens_per_s,
                                  "fast_tps": c.fast.tokens_per_s, "plain_step_ms_1": _ms(c.plain.plain_step_s),
                                  "plain_step_ms_2": _ms(c.fast.plain_step_s), "err_ms_1": _ms(c.plain.plain_step_err),
                                  "err_ms_2": _ms(c.fast.plain_step_err), "steady": c.steady, "slowdown": c.slowdown,
                                  "at_one_speed": c.at_one_speed, "acceptance": c.fast.acceptance}), flush=True)
            w.close()
    finally:
        if hog is not None:
            os.killpg(hog.pid, 9)


def _ms(seconds):
    return None if seconds is None else round(seconds * 1000, 1)


if __name__ == "__main__":
    sys.exit(main())
