"""What each strategy's speedup would be on bigger models on this machine: a bench's steps (its model's
acceptance, step by step) costed again with the pass costs measured at bigger sizes.

usage: python scripts/project_sizes.py BENCH_OUT_FOLDER [--costs FILE.json] [--cut 2,4,6]

Every step of every answer in BENCH_OUT_FOLDER/steps.jsonl (or .jsonl.xz) keeps its draft and what was kept;
only its cost changes: a pass over r rows costs c(r) plain steps, from `scripts/step_costs.py` or
`scripts/draft_costs.py` at each size (by default the table below, docs/bench/2026-12-05-gguf-sizes/: Q4_0/Q4_K_M
files of random weights of real shapes, compiled step, context 512, an Intel Xeon; `--costs` a JSON file of the
same for another machine: {"sizes": [{"name", "plain_ms", "passes": {"rows": steps, ...}, "head_share"}],
"bench_head_share"}). Between the rows measured, c is interpolated linearly; past the last, extended on the last
segment's slope. Drafting: a draft model's and the lookups' drafting keeps its milliseconds as the bench recorded
them (the same drafter on the same machine whatever the target; its reads of the prompt included: bench on a quiet
machine); a trained head's (eagle, medusa) is scaled by how much smaller a head (one
layer of the model's width and its LM head) is against the whole model at each size than at the bench's
(`head_share`). `--cut`: each strategy also with its drafts cut to k tokens (a step that drafted d > k keeps min(kept, k) + 1
tokens over k + 1 rows): with full-length drafts (`draft-model+no-confident`), the draft length that pays at
each size. The projection keeps the bench model's acceptance: a bigger model of the same family agrees with
a head's drafts at least as often, so for heads and lookups it is a floor as far as acceptance goes; a draft
model agrees less often with a bigger target than with a sibling of its own size, so for draft-model it is a
ceiling. Labelled a projection wherever it is quoted.
"""

from __future__ import annotations

import argparse
import json
import lzma
from collections import defaultdict
from pathlib import Path

# a pass over r rows (r = draft + 1) in plain steps, and a plain step in ms, context 512, from step_costs.py
# (Intel Xeon, 2026-12-05), with a trained head's parameters (12 hidden^2 for its layer, hidden x 49,152 for its
# LM head) over the model's
XEON = {
    "bench_head_share": 0.24,  # the bundled 135M: hidden 576
    "sizes": [
        {"name": "1B (Llama 3.2 1B shape, Q4_0)", "plain_ms": 32.2,
         "passes": {1: 1.00, 2: 1.07, 4: 1.15, 8: 1.44, 16: 2.25}, "head_share": 0.12},
        {"name": "3B (Llama 3.2 3B shape, Q4_K_M)", "plain_ms": 83.5, "passes": {1: 1.00, 8: 1.54}, "head_share": 0.08},
        {"name": "8B (Llama 3.1 8B shape, Q4_K_M)", "plain_ms": 192.6, "passes": {1: 1.00, 8: 1.45}, "head_share": 0.05},
    ],
}
HEADS = ("eagle", "medusa")  # drafters whose drafting grows with the target's width
SELF = ("layer-skip",)  # drafters that run the target's own layers: their drafting grows with its step


def cost(table: dict[int, float], rows: int) -> float:
    points = sorted(table.items())
    if rows <= points[0][0]:
        return points[0][1]
    for (r0, c0), (r1, c1) in zip(points, points[1:]):
        if rows <= r1:
            return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)
    (r0, c0), (r1, c1) = points[-2], points[-1]
    return c1 + (c1 - c0) * (rows - r1) / (r1 - r0)


def read_lines(folder: Path, name: str) -> list[dict]:
    path = folder / name
    text = path.read_text() if path.is_file() else lzma.open(f"{path}.xz", "rt").read()
    return [json.loads(line) for line in text.splitlines()]


def load_costs(path: Path | None) -> dict:
    if path is None:
        return XEON
    costs = json.loads(path.read_text())
    for size in costs["sizes"]:
        size["passes"] = {int(rows): float(c) for rows, c in size["passes"].items()}
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path)
    parser.add_argument("--costs", type=Path, help="a JSON file of the sizes' pass costs (default: the Xeon's above)")
    parser.add_argument("--cut", help="draft lengths to cut every strategy's drafts to, e.g. 2,4,6")
    args = parser.parse_args()
    costs = load_costs(args.costs)
    runs: dict[str, list[dict]] = defaultdict(list)
    for s in read_lines(args.bench, "steps.jsonl"):
        if s["step"] > 0:  # decode steps (the prompt's reading is the same for every strategy)
            runs[s["strategy"]].append(s)
    plain = [s["verify_ms"] + s["draft_ms"] for s in runs["none"] if s["step"] > 1]
    plain_ms = sum(plain) / len(plain)
    # what a step costs besides its pass and its drafting (events, detokenizing, bookkeeping): the same at every
    # size, in ms, from `none`'s answers
    trace = read_lines(args.bench, "trace.jsonl")
    none_ms = 1000 * sum(r["decode_s"] for r in trace if r["strategy"] == "none")
    overhead = max(0.0, (none_ms - sum(plain)) / len(plain))
    # the bench model's own passes by rows, for its row of a cut draft: the mean pass of each row count it ran
    by_rows: dict[int, list[float]] = defaultdict(list)
    for steps in runs.values():
        for s in steps:
            if s["step"] > 1:
                by_rows[1 + s["drafted"]].append(s["verify_ms"] / plain_ms)
    bench_passes = {rows: sum(c) / len(c) for rows, c in by_rows.items()}
    print(f"Steps from {args.bench}/steps.jsonl; the bench model's plain step: {plain_ms:.2f} ms (mean), "
          f"{overhead:.2f} ms more per step besides the pass\n")
    cuts = [int(k) for k in args.cut.split(",")] if args.cut else []
    columns = [(name, None) for name in runs] + [(name, k) for name in runs if name != "none" for k in cuts]
    print("| size | " + " | ".join(name if k is None else f"{name} cut to {k}" for name, k in columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for size in [None, *costs["sizes"]]:
        row = []
        for name, cut in columns:
            tokens, spent = 0, 0.0  # ms
            for s in runs[name]:
                drafted, new_tokens = s["drafted"], s["new_tokens"]
                if cut is not None and drafted > cut:
                    drafted, new_tokens = cut, min(s["accepted"], cut) + 1
                tokens += new_tokens
                rows = 1 + drafted
                drafter = (s.get("drafter") or name).split("+")[0]
                draft = s["draft_ms"] * (drafted / s["drafted"] if s["drafted"] else 1.0)
                if size is None:  # the step's own pass (a cut one's from the bench's passes), drafting as above
                    verify = s["verify_ms"] if drafted == s["drafted"] else cost(bench_passes, rows) * plain_ms
                    spent += verify + draft + overhead
                    continue
                if drafter in HEADS:
                    draft *= size["plain_ms"] / plain_ms * size["head_share"] / costs["bench_head_share"]
                elif drafter in SELF:
                    draft *= size["plain_ms"] / plain_ms
                spent += cost(size["passes"], rows) * size["plain_ms"] + draft + overhead
            plain_token = (plain_ms if size is None else size["plain_ms"]) + overhead
            row.append(f"{tokens * plain_token / spent:.2f}x")
        label = "the bench's model (measured in the bench itself)" if size is None else size["name"]
        print(f"| {label} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
