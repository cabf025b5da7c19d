"""The window's own Compare under auto on a real model, offscreen: the real MainWindow and its engine process (a
fresh data folder: no earlier answers) load the target (and a draft model), answer a question, then run Compare N
times on it; each line is one card's figures, the first line the answer's own (its footer's live figure).

    .venv/bin/python docs/bench/2026-12-07-compare-honest/compare_auto.py TARGET.gguf DRAFT.gguf auto 3 [--replay]

(DRAFT "-": no draft model.) --replay sends Compare's runs as they were sent before they measured the user's
answer: learning, and leaving nothing out (the strategy's run drafts the answer from the corpus).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
QUESTIONS = {
    "code-edit": "Rename the variable `x` to `total` in this function and add a docstring:\n\n"
                 "def add_all(items):\n    x = 0\n    for item in items:\n        x += item\n    return x\n",
    "translation": "Translate into French: The library opens at nine in the morning and closes at six in the "
                   "evening, except on Sundays, when it stays closed all day.",
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("strategy")
    parser.add_argument("n", type=int)
    parser.add_argument("--question", default="code-edit", choices=sorted(QUESTIONS))
    parser.add_argument("--replay", action="store_true")
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="specula-compare-"))
    os.environ["SPECULA_DATA_DIR"] = str(home / "data")  # the engine process's corpus starts empty
    from PySide6.QtWidgets import QApplication

    from specula.app.history_db import ConversationDB
    from specula.app.settings import SettingsStore
    from specula.app.window import MainWindow

    if args.replay:
        import specula.app.chat as chat

        original = chat.build_request

        def as_before(*a, **kw):
            kw.pop("learn", None), kw.pop("leave_out", None)
            return original(*a, **kw)

        chat.build_request = as_before
    app = QApplication([])

    def wait(condition, seconds: float, what: str) -> None:
        end = time.time() + seconds
        while not condition():
            if time.time() > end:
                raise SystemExit(f"timed out waiting for {what}")
            app.processEvents()
            time.sleep(0.01)

    asked = {"strategy": args.strategy, "max_new_tokens": 128, "model_source": args.target}
    if args.draft != "-":
        asked["draft_source"] = args.draft
    w = MainWindow(SettingsStore(home / "config"), ConversationDB(home / "data" / "conversations.db"),
                   overrides=asked)
    w.resize(1024, 700)
    w.show()
    w.start()
    wait(lambda: w.state == "ready", 900, "the model")
    replies = []
    w.chat.reply_finished.connect(lambda ok, event: replies.append(event))
    w.send_text(QUESTIONS[args.question])
    wait(lambda: replies, 600, "the answer")
    answer = replies[-1]
    print(json.dumps({"answer": True, "live": answer.speedup, "live_err": answer.speedup_err,
                      "tokens": answer.totals.new_tokens, "acceptance": answer.totals.acceptance_rate}), flush=True)
    for i in range(args.n):
        done = []
        w.compare.finished.connect(done.append)
        w.compare_last()
        wait(lambda: done, 900, "the comparison")
        w.compare.finished.disconnect()
        c = done[-1]
        if not c.done:
            print(json.dumps({"i": i, "error": c.error}), flush=True)
            continue
        print(json.dumps({"i": i, "headline": c.headline, "unsteady": c.unsteady, "second_pair": c.second_pair_why,
                          "figures": c.figures, "measured": c.speedup, "live": c.fast.live,
                          "live_err": c.fast.live_err, "identical": c.identical, "acceptance": c.fast.acceptance,
                          "plain_tps": c.plain.tokens_per_s, "fast_tps": c.fast.tokens_per_s,
                          "slowdown": c.slowdown}), flush=True)
    w.close()


if __name__ == "__main__":
    sys.exit(main())
