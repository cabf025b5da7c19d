"""What speculation with a draft model costs on this machine, in the target's plain steps: the target's verify passes
by their rows, and a draft token's forward with the draft model's vocabulary whole and cut (draft-model's
`draft_vocab`). Medians of --runs timings at a context of --context positions, through the compiled step.

    .venv/bin/python scripts/draft_costs.py TARGET.gguf [DRAFT.gguf] [--vocab 0,65536,32768] [--rows 2,4,8,16]
        [--json NAME]

Without a draft model only the target's passes are timed. `--json NAME` also prints the target's costs (medians
over the repeats) as one size of `scripts/project_sizes.py --costs`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specula.engine.api.types import ModelChoice
from specula.engine.cpu import step as compiled
from specula.engine.models.loading import load_model


def timed(runner, ids: torch.Tensor, context: int, rows: int, runs: int) -> float:
    """Median seconds of a pass of `rows` rows after `context` positions."""
    runner.truncate(0)
    runner.forward(ids[:context])
    times = []
    for _ in range(runs):
        runner.truncate(context)
        began = time.perf_counter()
        runner.forward(ids[context : context + rows], last=rows)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target")
    parser.add_argument("draft", nargs="?")
    parser.add_argument("--vocab", default="0,65536,32768", help="draft vocabularies to time (0: whole)")
    parser.add_argument("--rows", default="2,4,8,16", help="verify passes' rows to time")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=2, help="times the whole table is measured")
    parser.add_argument("--json", metavar="NAME", help="print the target's costs as a size named NAME for project_sizes.py")
    args = parser.parse_args()
    compiled.prepare(wait=True)
    target = load_model(ModelChoice(args.target, step="compiled"))
    draft = load_model(ModelChoice(args.draft, step="compiled")) if args.draft else None
    ids = torch.randint(0, 30000, (args.context + 32,), generator=torch.Generator().manual_seed(0))
    rows = [int(r) for r in args.rows.split(",")]
    vocabs = [int(v) for v in args.vocab.split(",")]
    t_runner = target.new_runner()
    d_runners = {}
    for v in vocabs if draft is not None else ():
        d_runners[v] = draft.new_runner()
        d_runners[v].limit_vocab(v)
    steps, passes_by_rows = [], {r: [] for r in rows}
    for _ in range(args.repeat):
        step = timed(t_runner, ids, args.context, 1, args.runs)
        steps.append(step)
        for r in rows:
            passes_by_rows[r].append(timed(t_runner, ids, args.context, r, args.runs) / step)
        passes = ", ".join(f"{r} rows {passes_by_rows[r][-1]:.2f}" for r in rows)
        print(f"target step {1000 * step:.1f} ms; passes in steps: {passes}")
        if draft is None:
            continue
        tokens = ", ".join(f"vocab {v or 'whole'} {1000 * (s := timed(d_runners[v], ids, args.context, 1, args.runs)):.1f} ms "
                           f"({s / step:.2f})" for v in vocabs)
        print(f"draft token: {tokens}")
    if args.json:
        print(json.dumps({"name": args.json, "plain_ms": round(1000 * statistics.median(steps), 2),
                          "passes": {1: 1.0} | {r: round(statistics.median(c), 3) for r, c in passes_by_rows.items()}}))


if __name__ == "__main__":
    main()
