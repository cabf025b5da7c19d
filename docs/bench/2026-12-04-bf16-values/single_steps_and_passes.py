"""Single steps and passes of 1 to 16 rows at 4,000 and 1,000 positions of cache: the fp32 values against their
bf16 copy (LlamaRunner.narrow_values), two runners of the bundled model in one process, interleaved call by call.

    .venv/bin/python docs/bench/2026-12-04-bf16-values/single_steps_and_passes.py   # REPS=25 by default

Prints the least and the median milliseconds of each (the first two calls of each left out)."""

import os
import statistics
import time

import torch

from specula.engine.api.types import ModelSpec
from specula.engine.cpu import step as compiled
from specula.engine.cpu.step import StepMode
from specula.engine.models.loading import load_model

compiled.prepare(wait=True)
loaded = load_model(ModelSpec("bundled"))
loaded.step = StepMode("compiled")
gen = torch.Generator().manual_seed(0)
ids = torch.randint(0, 40000, (4000,), generator=gen)
runners = {}
for name, narrow in (("fp32 values", False), ("bf16 copy", True)):
    runner = loaded.new_runner()
    runner.narrow_values = narrow
    runner.forward(ids[:1])
    runner.forward(ids[1:], last=1)
    runners[name] = runner
times = {}
for context in (4000, 1000):
    for rows in (1, 4, 8, 16):
        tokens = torch.randint(0, 40000, (rows,), generator=gen)
        for _ in range(int(os.environ.get("REPS", "25"))):
            for name, runner in runners.items():
                runner.truncate(context)
                t0 = time.perf_counter()
                runner.forward(tokens, last=1)
                times.setdefault((context, rows, name), []).append(time.perf_counter() - t0)
for (context, rows, name), t in times.items():
    kept = t[2:]
    print(f"context {context}, {rows} rows, {name}: least {min(kept) * 1e3:.2f} ms, median {statistics.median(kept) * 1e3:.2f} ms")
