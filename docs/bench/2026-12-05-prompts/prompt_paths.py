"""How long reading a prompt takes through the compiled step against the eager forward (dense bf16 products
through oneDNN), on the bundled model, alternating in one process; medians.

usage: python prompt_paths.py LENGTHS [REPEATS]     e.g. 60,150,300,600,1000,2000 5
"""
import statistics
import sys
import time

import torch

import specula.engine.models.llama as llama
from specula.engine.api.types import LoadRequest, ModelSpec
from specula.engine.serving.session import Session

session = Session()
session.load(LoadRequest(ModelSpec("bundled", "cpu", "bf16", step="compiled"), measure_baseline=False))
runner = session._runner
gen = torch.Generator().manual_seed(0)
for n in [int(x) for x in sys.argv[1].split(",")]:
    toks = torch.randint(100, 40000, (n,), generator=gen)
    times = {True: [], False: []}
    for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):
        for mode in ((True, False) if rep % 2 else (False, True)):
            llama.prompt_through_step = lambda fast, dtype, m=mode: m
            runner.truncate(0)
            t0 = time.perf_counter(); runner.forward(toks); times[mode].append(time.perf_counter() - t0)
    c, e = statistics.median(times[True]), statistics.median(times[False])
    print(f"{n:5d} tokens: compiled {1000*c:8.1f} ms  eager {1000*e:8.1f} ms  compiled/eager {c/e:.2f}", flush=True)
