"""How far can prompt lookup go on these prompts? Replays drafting policies against the target's own
greedy answers instead of running the model for each policy.

usage: python scripts/lookup_ceiling.py PROMPTS.jsonl [--limit-per-category 2] [--max-new-tokens 96]
       [--answers answers.jsonl]

Greedy decoding is deterministic and speculation is lossless, so for a given prompt every strategy
produces the same answer; a draft's accepted length is its common prefix with the answer at that
point. The script generates each answer once with `none` (or reads them back from --answers), then
replays: the engine's prompt lookup, fixed draft lengths, and an oracle that picks, among all earlier
matches of any length, the one whose continuation the target accepts furthest (the ceiling for any
policy that copies from the context, multi-candidate trees included). Step costs come from timing the
loaded model's forward over 1..16 tokens at the prompt's length; a speedup is estimated as
(prefill + plain steps) / (prefill + speculative steps), per category.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from specula.engine.api.events import Finished
from specula.engine.api.prompts import Message, conversation
from specula.engine.api.types import DecodeConfig, GenerateRequest, LoadRequest, ModelChoice
from specula.engine.cli.bench.report import SPEC_BENCH, spec_bench_group
from specula.engine.cli.bench.run import load_items
from specula.engine.drafters.prompt_lookup import DRAFT_PER_MATCHED_TOKEN, longest_match
from specula.engine.serving.session import Session


def answers(session: Session, items, max_new: int) -> list[dict]:
    out = []
    for item in items:
        history: tuple[Message, ...] = ()
        for text in item.turns:
            messages = conversation(text, None, history)
            request = GenerateRequest(messages, "none", DecodeConfig(max_new_tokens=max_new), True)
            ids = session.encode(request)
            f = [e for e in session.generate(request) if isinstance(e, Finished)][0]
            out.append({"category": item.category, "context": ids, "answer": list(f.token_ids),
                        "prefill_s": f.totals.prefill_s})
            history = messages + (Message("assistant", f.text),)
    return out


def step_costs(session: Session, context: int, sizes=(1, 2, 3, 4, 5, 6, 8, 12, 16)) -> dict[int, float]:
    runner = session.target.new_runner()
    runner.forward(torch.randint(0, 1000, (context,)))
    costs = {}
    for t in sizes:
        times = []
        for _ in range(7):
            x = torch.randint(0, 1000, (t,))
            t0 = time.perf_counter()
            runner.forward(x, last=t)
            times.append(time.perf_counter() - t0)
            runner.truncate(context)
        costs[t] = statistics.median(times)
    return costs


def cost_of(costs: dict[int, float], t: int) -> float:
    sizes = sorted(costs)
    return float(np.interp(t, sizes, [costs[s] for s in sizes]))


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def engine_policy(k: int):
    def draft(seq: np.ndarray, length: int) -> list[int]:
        n, start = longest_match(seq[:length], 16)
        return seq[start : start + min(k, DRAFT_PER_MATCHED_TOKEN * n)].tolist() if n else []
    return draft


def fixed_policy(k: int):
    def draft(seq: np.ndarray, length: int) -> list[int]:
        n, start = longest_match(seq[:length], 4)
        return seq[start : min(start + k, length)].tolist() if n else []
    return draft


def oracle_policy(k: int):
    def draft(seq: np.ndarray, length: int) -> list[int]:
        best: list[int] = []
        for end in np.flatnonzero(seq[: length - 1] == seq[length - 1]):
            cand = seq[end + 1 : min(end + 1 + k, length)].tolist()
            kept = common_prefix(cand, seq[length:].tolist())
            if kept > len(best):
                best = cand[:kept]
        return best
    return draft


def replay(policy, record, costs) -> tuple[float, float, int]:
    seq = np.array(record["context"] + record["answer"])
    end = len(seq)
    length = len(record["context"]) + 1  # the prefill chose the first answer token
    spec = plain = 0.0
    steps = 0
    while length < end:
        d = policy(seq, length)[: end - length]
        kept = common_prefix(d, seq[length:end].tolist())
        spec += cost_of(costs, len(d) + 1)
        plain += cost_of(costs, 1) * (kept + 1)
        length += kept + 1
        steps += 1
    return plain, spec, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts", type=Path)
    ap.add_argument("--categories", default=None)
    ap.add_argument("--limit-per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--answers", type=Path, default=None, help="JSON Lines cache of the greedy answers")
    args = ap.parse_args()
    session = Session()
    session.load(LoadRequest(ModelChoice("bundled", "cpu", "bf16"), measure_baseline=False))
    if args.answers and args.answers.is_file():
        records = [json.loads(line) for line in args.answers.read_text().splitlines()]
    else:
        items = load_items(args.prompts, args.categories, args.limit_per_category)
        records = answers(session, items, args.max_new_tokens)
        if args.answers:
            args.answers.write_text("".join(json.dumps(r) + "\n" for r in records))
    costs_by_len = {}
    policies = {"engine (2 x match, k 8)": engine_policy(8), "fixed k 4": fixed_policy(4),
                "fixed k 8": fixed_policy(8), "oracle k 8": oracle_policy(8), "oracle k 16": oracle_policy(16)}
    table = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0.0, 0, 0]))
    for r in records:
        bucket = 256 * (len(r["context"]) // 256 + 1)
        if bucket not in costs_by_len:
            costs_by_len[bucket] = step_costs(session, bucket)
        costs = costs_by_len[bucket]
        for name, policy in policies.items():
            plain, spec, steps = replay(policy, r, costs)
            cell = table[name][r["category"]]
            cell[0] += r["prefill_s"] + plain
            cell[1] += r["prefill_s"] + spec
            cell[2] += len(r["answer"])
            cell[3] += steps
    cats = sorted({r["category"] for r in records})
    print("| policy | " + " | ".join(cats) + " | mean |")
    print("|---" * (len(cats) + 2) + "|")
    for name, per in table.items():
        speedups = [per[c][0] / per[c][1] for c in cats]
        print(f"| {name} | " + " | ".join(f"{s:.2f}x" for s in speedups) + f" | {statistics.mean(speedups):.2f}x |")
    groups = [g for g in SPEC_BENCH if any(spec_bench_group(c) == g for c in cats)]
    if groups:
        print("\nSpec-Bench's categories (MT-bench's eight as one):\n")
        print("| policy | " + " | ".join(groups) + " | mean |")
        print("|---" * (len(groups) + 2) + "|")
        for name, per in table.items():
            speedups = []
            for g in groups:
                members = [c for c in cats if spec_bench_group(c) == g]
                speedups.append(sum(per[c][0] for c in members) / sum(per[c][1] for c in members))
            print(f"| {name} | " + " | ".join(f"{s:.2f}x" for s in speedups) + f" | {statistics.mean(speedups):.2f}x |")


if __name__ == "__main__":
    main()
