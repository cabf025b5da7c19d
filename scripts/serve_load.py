"""Many clients at once against `specula serve` with a bounded queue: every request is answered or refused
with 429, none is lost, no answer is another prompt's, and the server's memory stays flat.

usage: python scripts/serve_load.py [--model bundled] [--clients 64] [--max-queue 8] [--max-tokens 16]
                                    [--rounds 2] [--out FILE.json]

Starts `specula serve --max-queue N --step compiled` on a free port (every answer through the same step, so
greedy answers are comparable), asks every prompt once alone (the reference
answers, greedy), then sends `--clients` requests at the same moment (each a prompt of its own), `--rounds`
times. Each answer must equal its prompt's reference answer; each refusal must be a 429 with Retry-After.
Reported: the counts, the time a refusal took, the time the answered ones took, and the server's resident
memory before and after each round (from /proc).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOPICS = ["cats", "the sea", "bread", "trains", "winter", "music", "a garden", "the moon", "rain", "chess", "bees",
          "a library", "coffee", "mountains", "a river", "clocks"]


def prompt(i: int) -> str:
    return f"Say one short sentence about {TOPICS[i % len(TOPICS)]} (note {i})."


def ask(url: str, i: int, max_tokens: int) -> tuple[int, str, float, str | None]:
    body = json.dumps({"messages": [{"role": "user", "content": prompt(i)}], "max_tokens": max_tokens,
                       "temperature": 0}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            text = json.loads(response.read())["choices"][0]["message"]["content"]
            return response.status, text, time.perf_counter() - t0, None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), time.perf_counter() - t0, exc.headers.get("Retry-After")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bundled")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--max-queue", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "specula.engine.cli.main", "serve", "--model", args.model,
                               "--port", "0", "--announce", "--max-queue", str(args.max_queue), "--no-baseline",
                               "--strategy", "none", "--step", "compiled"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = json.loads(server.stdout.readline())["url"]
        deadline = time.time() + 600
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                raise SystemExit("the server never became ready")
            time.sleep(0.5)
        reference = {i: ask(url, i, args.max_tokens)[1] for i in range(args.clients)}
        report = {"clients": args.clients, "max_queue": args.max_queue, "max_tokens": args.max_tokens, "rounds": []}
        for r in range(args.rounds):
            before = rss_mb(server.pid)
            results: dict[int, tuple] = {}
            start = threading.Barrier(args.clients)

            def client(i: int) -> None:
                start.wait()
                results[i] = ask(url, i, args.max_tokens)

            threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            answered = [i for i, res in results.items() if res[0] == 200]
            refused = [i for i, res in results.items() if res[0] == 429]
            wrong = [i for i in answered if results[i][1] != reference[i]]
            mixed = [i for i in wrong if results[i][1] in reference.values()]
            other = {i: results[i][0] for i in results if results[i][0] not in (200, 429)}
            retry = [results[i][3] for i in refused]
            row = {"answered": len(answered), "refused_429": len(refused), "other": other, "lost": args.clients - len(results),
                   "answers_not_their_prompts": len(wrong), "answers_of_other_prompts": len(mixed), "refusals_without_retry_after": sum(1 for x in retry if not x),
                   "retry_after_s": sorted({int(x) for x in retry if x}),
                   "refusal_ms_median": round(statistics.median([results[i][2] for i in refused]) * 1000, 1) if refused else None,
                   "answer_s_max": round(max([results[i][2] for i in answered], default=0), 2),
                   "wall_s": round(wall, 2), "rss_mb_before": round(before, 1), "rss_mb_after": round(rss_mb(server.pid), 1)}
            report["rounds"].append(row)
            print(json.dumps(row), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        bad = any(row["lost"] or row["other"] or row["answers_not_their_prompts"] or row["refusals_without_retry_after"]
                  for row in report["rounds"])
        return 1 if bad else 0
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
