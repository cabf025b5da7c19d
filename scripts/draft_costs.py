"""What speculation with a draft model costs on this machine, in the target's plain steps: the target's verify passes
by their rows, and a draft token's forward with the draft model's vocabulary whole and cut (draft-model's
`draft_vocab`). Medians of --runs timings at a context of --context positions, through the compiled step.

    .venv/bin/python scripts/draft_costs.py TARGET.gguf DRAFT.gguf [--vocab 0,65536,32768] [--rows 2,4,8,16]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specula.engine.api.types import ModelSpec
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
    parser.add_argument("draft")
    parser.add_argument("--vocab", default="0,65536,32768", help="draft vocabularies to time (0: whole)")
    parser.add_argument("--rows", default="2,4,8,16", help="verify passes' rows to time")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=2, help="times the whole table is measured")
    args = parser.parse_args()
    compiled.prepare(wait=True)
    target = load_model(ModelSpec(args.target, step="compiled"))
    draft = load_model(ModelSpec(args.draft, step="compiled"))
    ids = torch.randint(0, 30000, (args.context + 32,), generator=torch.Generator().manual_seed(0))
    rows = [int(r) for r in args.rows.split(",")]
    vocabs = [int(v) for v in args.vocab.split(",")]
    t_runner = target.new_runner()
    d_runners = {}
    for v in vocabs:
        d_runners[v] = draft.new_runner()
        d_runners[v].limit_vocab(v)
    for _ in range(args.repeat):
        step = timed(t_runner, ids, args.context, 1, args.runs)
        passes = ", ".join(f"{r} rows {timed(t_runner, ids, args.context, r, args.runs) / step:.2f}" for r in rows)
        print(f"target step {1000 * step:.1f} ms; passes in steps: {passes}")
        tokens = ", ".join(f"vocab {v or 'whole'} {1000 * (s := timed(d_runners[v], ids, args.context, 1, args.runs)):.1f} ms "
                           f"({s / step:.2f})" for v in vocabs)
        print(f"draft token: {tokens}")


if __name__ == "__main__":
    main()
