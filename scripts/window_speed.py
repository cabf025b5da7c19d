"""Plain decoding in the window against `specula generate`, on the same prompts, one after the other.

usage: python scripts/window_speed.py [--prompts FILE] [--limit N] [--max-new-tokens T] [--rounds R]
                                      [--strategy S] [--out FILE.json]

Each round runs every prompt (its first turn, one new conversation each) through `specula generate
--json` in one process, then through the desktop app (offscreen, its engine in its own process) in
another; rounds alternate so that a slow spell of the machine hits both. Both sides time decoding the
same way (the engine's own clock: tokens after the first / time after the first), so the ratio says what
the window costs the engine. The token ids must agree (greedy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WINDOW = textwrap.dedent('''
    import json, resource, sys, time
    from pathlib import Path
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from specula.app.history_db import ConversationDB
    from specula.app.settings import SettingsStore
    from specula.app.window import MainWindow

    home, prompts, strategy, limit = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    import os; os.nice(int(os.environ.get("GUI_NICE", "0")))
    app = QApplication([])
    w = MainWindow(SettingsStore(home / "config"), ConversationDB(home / "conversations.db"),
                   overrides={"strategy": strategy, "max_new_tokens": limit})
    w.resize(1280, 800)
    if not os.environ.get("WINDOW_HIDDEN"):
        w.show()
    done, start = [], {}

    def send_next():
        if len(done) == len(prompts):
            used = resource.getrusage(resource.RUSAGE_SELF)
            cpu = used.ru_utime + used.ru_stime - start["cpu"]
            print("CPU " + json.dumps({"cpu_s": cpu, "wall_s": time.time() - start["wall"]}), flush=True)
            app.quit()
            return
        w.chat.new_conversation()
        assert w.send_text(prompts[len(done)])

    def finished(ok, event):
        done.append(event)
        t = event.totals
        print("ROW " + json.dumps({"new_tokens": t.new_tokens, "wall_s": t.wall_s, "prefill_s": t.prefill_s,
                                   "token_ids": list(event.token_ids)}), flush=True)
        QTimer.singleShot(0, send_next)

    def ready():
        if not start:  # the event loop runs idle from here on, as in use
            used = resource.getrusage(resource.RUSAGE_SELF)
            start.update(cpu=used.ru_utime + used.ru_stime, wall=time.time())
            send_next()

    w.chat.reply_finished.connect(finished)
    w.model_ready.connect(ready)
    QTimer.singleShot(1_800_000, app.quit)
    w.start()
    app.exec()
    w.close()
''')


def run_generate(prompts_file: Path, strategy: str, limit: int) -> list[dict]:
    command = [sys.executable, "-m", "specula.engine.cli", "generate", "--prompts", str(prompts_file), "--json", "--chat",
               "--strategy", strategy, "--max-new-tokens", str(limit)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def run_window(prompts: list[str], strategy: str, limit: int, home: Path) -> list[dict]:
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen"),
           "SPECULA_CONFIG_DIR": str(home / "config"), "SPECULA_DATA_DIR": os.environ.get("SPECULA_DATA_DIR", str(home / "data"))}
    done = subprocess.run([sys.executable, "-c", WINDOW, str(home), json.dumps(prompts), strategy, str(limit)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    rows = [json.loads(line[4:]) for line in done.stdout.splitlines() if line.startswith("ROW ")]
    for line in done.stdout.splitlines():
        if line.startswith("CPU "):
            cpu = json.loads(line[4:])
            print(f"  the window's process used {cpu['cpu_s']:.1f} s of CPU in {cpu['wall_s']:.1f} s", flush=True)
    if len(rows) != len(prompts):
        raise SystemExit(f"the window run failed:\n{done.stderr[-3000:]}")
    return rows


def rate(rows: list[dict]) -> float:
    """Tokens after each answer's first / decode time after it, over all answers."""
    tokens = sum(r["new_tokens"] - 1 for r in rows if r["new_tokens"] > 1)
    seconds = sum(r["wall_s"] - r["prefill_s"] for r in rows if r["new_tokens"] > 1)
    return tokens / seconds if seconds > 0 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=ROOT.parent / "shared/datasets/spec_bench/question.jsonl")
    parser.add_argument("--limit", type=int, default=12, help="prompts (spread over the file's categories)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    by_category: dict[str, list[dict]] = {}
    for row in rows:
        by_category.setdefault(row.get("category", ""), []).append(row)
    chosen: list[dict] = []
    while len(chosen) < args.limit and any(by_category.values()):
        for items in by_category.values():
            if items and len(chosen) < args.limit:
                chosen.append(items.pop(0))
    prompts = [row["turns"][0] for row in chosen]
    results: dict[str, list[float]] = {"generate": [], "window": []}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.jsonl"
        prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
        for r in range(args.rounds):
            gen = run_generate(prompts_file, args.strategy, args.max_new_tokens)
            win = run_window(prompts, args.strategy, args.max_new_tokens, Path(tmp) / f"home{r}")
            same &= [g["token_ids"] for g in gen] == [w["token_ids"] for w in win]
            results["generate"].append(rate(gen))
            results["window"].append(rate(win))
            print(f"round {r + 1}: generate {results['generate'][-1]:.1f} tok/s, window {results['window'][-1]:.1f} "
                  f"tok/s, ratio {results['window'][-1] / results['generate'][-1]:.3f}", flush=True)
    g, w = sum(results["generate"]) / args.rounds, sum(results["window"]) / args.rounds
    summary = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "strategy": args.strategy,
               "generate_tok_s": g, "window_tok_s": w, "ratio": w / g, "rounds": results, "same_tokens": same}
    print(json.dumps(summary))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
