"""The first answers after a start: time to first token and tokens/s of answers 1, 2 and 3, in the terminal
(`specula generate`), the server (`specula serve`) and the window (the desktop app, offscreen).

usage: python scripts/first_answer.py [--starts N] [--max-new-tokens T] [--strategy S] [--out FILE.json]

Each start is a new process on the bundled model (the compiled step cached, as on every start after the first);
its answers are three different prompts of one category (Spec-Bench's qa, 36-46 characters), each a new
conversation, greedy, in an order that turns with each start (three starts: each prompt once in each place). The figures are the engine's own clock (tokens after the first / time after the first;
the prompt's reading as the time to first token), so the three front-ends are timed alike; the server's also
from the client (request to response). Checks: the first answer within 15% of the second in tokens/s.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from window_speed import run_window  # noqa: E402  (the desktop app offscreen, one answer per prompt)

ANSWERS = 3


def prompts(path: Path) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows if r.get("category") == "qa"][:ANSWERS]


def row(new_tokens: int, wall_s: float, prefill_s: float, client_s: float | None = None) -> dict:
    decode = wall_s - prefill_s
    return {"ttft_s": prefill_s, "tokens_per_s": (new_tokens - 1) / decode if new_tokens > 1 and decode > 0 else 0.0,
            "new_tokens": new_tokens, **({"client_s": client_s} if client_s is not None else {})}


def terminal(texts: list[str], strategy: str, limit: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "prompts.jsonl"
        file.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
        command = [sys.executable, "-m", "specula.engine.cli", "generate", "--prompts", str(file), "--json", "--chat",
                   "--strategy", strategy, "--max-new-tokens", str(limit)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return [row(r["new_tokens"], r["wall_s"], r["prefill_s"]) for r in rows]


def server(texts: list[str], strategy: str, limit: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "specula.engine.cli", "serve", "--model", "bundled", "--port", str(port),
               "--strategy", strategy]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:  # ready: the model listed
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                    if json.load(r).get("data"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not come up")
            time.sleep(0.2)
        rows = []
        for text in texts:
            body = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": limit,
                               "temperature": 0}).encode()
            request = urllib.request.Request(base + "/v1/chat/completions", body, {"Content-Type": "application/json"})
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=300) as r:
                answer = json.load(r)
            client = time.perf_counter() - t0
            t = answer["specula"]["totals"]
            rows.append(row(t["new_tokens"], t["wall_s"], t["prefill_s"], client))
        return rows
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def window(texts: list[str], strategy: str, limit: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_window(texts, strategy, limit, Path(tmp))
    return [row(r["new_tokens"], r["wall_s"], r["prefill_s"]) for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=ROOT.parent / "shared/datasets/spec_bench/question.jsonl")
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--strategy", default="none")
    parser.add_argument("--front-ends", default="terminal,server,window")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    texts = prompts(args.prompts)
    runs = {"terminal": terminal, "server": server, "window": window}
    chosen = [f.strip() for f in args.front_ends.split(",") if f.strip()]
    results: dict[str, list[list[dict]]] = {name: [] for name in chosen}
    for start in range(args.starts):  # front-ends alternate, so a slow spell of the machine hits all
        for name in chosen:
            order = texts[start % ANSWERS:] + texts[: start % ANSWERS]
            results[name].append(runs[name](order, args.strategy, args.max_new_tokens))
            print(f"start {start + 1} {name}: " + ", ".join(
                f"#{i + 1} {r['ttft_s'] * 1000:.0f} ms, {r['tokens_per_s']:.0f} tok/s" for i, r in enumerate(results[name][-1])),
                flush=True)
    print("\n| front-end | answer | time to first token (mean) | tokens/s (mean) | against the second |")
    print("|---|---|---|---|---|")
    summary = {}
    for name, starts in results.items():
        rates = [statistics.fmean(s[i]["tokens_per_s"] for s in starts) for i in range(ANSWERS)]
        ttfts = [statistics.fmean(s[i]["ttft_s"] for s in starts) for i in range(ANSWERS)]
        summary[name] = {"tokens_per_s": rates, "ttft_s": ttfts, "starts": starts}
        for i in range(ANSWERS):
            print(f"| {name} | {i + 1} | {ttfts[i] * 1000:.0f} ms | {rates[i]:.0f} | {rates[i] / rates[1] - 1:+.0%} |")
    worst = min(s["tokens_per_s"][0] / s["tokens_per_s"][1] for s in summary.values())
    print(f"\nThe first answer against the second, worst front-end: {worst - 1:+.0%} (the check: within 15%)")
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
