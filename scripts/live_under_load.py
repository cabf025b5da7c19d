"""The live speedup against the speedup measured back to back, quiet and under load.

Runs `specula bench` (`none` first and last in each prompt's turn, the strategies between) with busy
processes beside it, several rounds, and sets the speedup each answer measured inside itself (the figure the
window's dock and footer show, ± one error) against how much faster it decoded than `none` on the same
prompt under the same load (the bench's decode ratio against the mean of `none`'s two runs).

    .venv/bin/python scripts/live_under_load.py --busy 2 --rounds 1 --limit 2 --out /tmp/live-load

Prints a Markdown table per round and answer (answer, live, measured, error) and the count of answers within
10% of the measured ratio; an answer that reads above 1.0x where the measured ratio is below 0.95x is marked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY = "while True: pass"
# Spec-Bench's six categories: MT-bench's eight (one multi-turn category) and five more
ALL_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
                  "translation", "summarization", "qa", "math_reasoning", "rag")


def bench(args, out: Path) -> None:
    command = [sys.executable, "-m", "specula.engine.cli", "bench", "--model", args.model, "--step", args.step,
               "--prompts", args.prompts, "--categories", args.categories, "--limit-per-category", str(args.limit),
               "--strategies", args.strategies, "--max-new-tokens", str(args.max_new_tokens), "--out", str(out)]
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    try:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    finally:
        for p in busy:
            p.kill()
            p.wait()


TOLERANCE = 0.10


def judged(live: float | None, measured: float | None) -> str:
    if live is None or measured is None:
        return "-"
    if live > 1.0 and measured < 0.95:
        return "**reads faster where it was slower**"
    return "within 10%" if abs(live - measured) <= TOLERANCE * measured else "**off**"


def error(live: float | None, measured: float | None) -> str:
    return "-" if live is None or measured is None else f"{live / measured - 1:+.0%}"


def shown(live: float | None, error: float | None) -> str:
    if live is None:
        return "-"
    return f"{live:.2f}x" + (f" ±{error:.2f}" if error is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--step", default="compiled")
    parser.add_argument("--prompts", default=str(ROOT.parent / "shared/datasets/spec_bench/question.jsonl"))
    parser.add_argument("--categories", default=",".join(ALL_CATEGORIES))
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--strategies", default="none,prompt-lookup,auto")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the bench")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lines = ["| round | strategy | prompt | measured vs none | live (in the answer) | error | judged |",
             "|---|---|---|---|---|---|---|"]
    totals, counted, within, wrong_side = [], 0, 0, 0
    for n in range(1, args.rounds + 1):
        out = args.out / f"round{n}"
        bench(args, out)
        for row in map(json.loads, (out / "trace.jsonl").read_text().splitlines()):
            if row["strategy"] == "none":
                continue
            live, err, measured = row.get("live_speedup"), row.get("live_error"), row.get("decode_speedup")
            verdict = judged(live, measured)
            counted += verdict != "-"
            within += verdict == "within 10%"
            wrong_side += verdict.startswith("**reads")
            lines.append(f"| {n} | {row['strategy']} | {row['category']} {row['question_id']} | "
                         f"{measured:.2f}x | {shown(live, err)} | {error(live, measured)} | {verdict} |")
        for name, o in json.loads((out / "bench.json").read_text())["overall"].items():
            if name != "none":
                live, err, measured = o.get("live_speedup"), o.get("live_error"), o.get("decode_speedup")
                totals.append(f"| {n} | {name} | all | {measured:.2f}x | {shown(live, err)} | {error(live, measured)} | "
                              f"{judged(live, measured)} |")
    print("\n".join(lines))
    print("\nOver all prompts of a round:\n")
    print("\n".join(lines[:2] + totals))
    print(f"\n{within} of {counted} answers within 10% of the measured ratio; {wrong_side} read above 1.0x where "
          "the measured ratio is below 0.95x.")


if __name__ == "__main__":
    main()
