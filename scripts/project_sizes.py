"""What each strategy's speedup would be on bigger models on this machine: a bench's steps (the bundled model's
acceptance, step by step) costed again with the pass costs measured at 1B, 3B and 8B.

usage: python scripts/project_sizes.py BENCH_OUT_FOLDER [--costs FILE.json]

Every step of every answer in BENCH_OUT_FOLDER/steps.jsonl keeps its draft and what was kept; only its cost
changes: a pass over r rows costs c(r) plain steps, from `scripts/step_costs.py` at each size (the table
below, docs/bench/2026-12-05-gguf-sizes/: Q4_0/Q4_K_M files of random weights of real shapes, compiled step,
context 512). Between the rows measured, c is interpolated linearly; past the last, extended on the last
segment's slope. Drafting: each step's drafting time, in the bundled model's plain steps, scaled by how
much smaller a trained head (one layer of the model's width and its LM head) is against the whole model at
each size than at 135M (`HEAD_SHARE`); prompt lookup's and the other lookups' few tens of microseconds shrink
more than that against a bigger model's step, so this overstates their cost a little. The projection: the bundled model's acceptance; a bigger model of the same family agrees with such
drafts at least as often, so it is a floor as far as acceptance goes.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

# a pass over r rows (r = draft + 1) in plain steps, and a plain step in ms, context 512, from step_costs.py
COSTS = {
    "bundled 135M (measured in the bench itself)": None,
    "1B (Llama 3.2 1B shape, Q4_0)": ({1: 1.00, 2: 1.07, 4: 1.15, 8: 1.44, 16: 2.25}, 32.2),
    "3B (Llama 3.2 3B shape, Q4_K_M)": ({1: 1.00, 8: 1.54}, 83.5),
    "8B (Llama 3.1 8B shape, Q4_K_M)": ({1: 1.00, 8: 1.45}, 192.6),
}
# a trained head's parameters (12 hidden^2 for its layer, hidden x 49,152 for its LM head) over the model's
BUNDLED_HEAD_SHARE = 0.24  # 135M: hidden 576
HEAD_SHARE = {"1B (Llama 3.2 1B shape, Q4_0)": 0.12, "3B (Llama 3.2 3B shape, Q4_K_M)": 0.08,
              "8B (Llama 3.1 8B shape, Q4_K_M)": 0.05}


def cost(table: dict[int, float], rows: int) -> float:
    points = sorted(table.items())
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, c0), (r1, c1) in zip(points, points[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = points[-2], points[-1]
    return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path)
    args = parser.parse_args()
    steps = [json.loads(line) for line in (args.bench / "steps.jsonl").read_text().splitlines()]
    runs: dict[str, list[dict]] = defaultdict(list)
    for s in steps:
        if s["step"] > 0:  # decode steps (the prompt's reading is the same for every strategy)
            runs[s["strategy"]].append(s)
    plain = [s["verify_ms"] + s["draft_ms"] for s in runs["none"] if s["step"] > 1]
    plain_ms = sum(plain) / len(plain)
    # what a step costs besides its pass and its drafting (events, detokenizing, bookkeeping): the same at every
    # size, in ms, from `none`'s answers
    trace = [json.loads(line) for line in (args.bench / "trace.jsonl").read_text().splitlines()]
    none_ms = 1000 * sum(r["decode_s"] for r in trace if r["strategy"] == "none")
    overhead = max(0.0, (none_ms - sum(plain)) / len(plain))
    print(f"Steps from {args.bench}/steps.jsonl; the bundled model's plain step: {plain_ms:.2f} ms (mean), "
          f"{overhead:.2f} ms more per step besides the pass\n")
    names = list(runs)  # none's own: 1.00x, a check of the costing
    print("| size | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for size, measured in COSTS.items():
        row = []
        for name in names:
            tokens = sum(s["new_tokens"] for s in runs[name])
            spent = 0.0  # ms
            for s in runs[name]:
                rows = 1 + s["drafted"] if s["drafted"] else 1
                if measured is None:  # the step's own pass and drafting
                    spent += s["verify_ms"] + s["draft_ms"] + overhead
                else:
                    table, plain = measured
                    draft = s["draft_ms"] * plain / plain_ms * HEAD_SHARE[size] / BUNDLED_HEAD_SHARE
                    spent += cost(table, rows) * plain + draft + overhead
            plain_token = (plain_ms if measured is None else measured[1]) + overhead
            row.append(f"{tokens * plain_token / spent:.2f}x")
        print(f"| {size} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
