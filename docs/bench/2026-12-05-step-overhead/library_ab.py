"""Two builds of the compiled step against each other, one process each (the library registers its operations
once per process), run in turn: A B B A A B ... so that neither always runs first.

usage: python library_ab.py A.so B.so [pairs]

Each process loads the bundled model with the given library, reads a 100-token context, and times passes of 1, 2,
4 and 8 rows over it (the median of five rounds of 30) and the reading of a 1,000-token prompt (the median of 3).
Prints one line per process and, at the end, the median over pairs of B's time over A's. Build a library from a
commit's sources with `python -c "from specula.engine.cpu import step as S; S.prepare(True); print(S.library_path(S._compiler()))"`
run in a checkout of it, and copy the file it names."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys

CHILD = r'''
import gc, statistics, sys, time
from pathlib import Path
import torch
import specula.engine.cpu.step as S
S.library_path = lambda cxx: Path(sys.argv[1])
from specula.engine.api.types import ModelSpec
from specula.engine.models.loading import load_model
loaded = load_model(ModelSpec("bundled", "cpu", "bf16", "auto", "compiled"))
runner = loaded.new_runner()
ids = torch.randint(100, 40000, (1200,), generator=torch.Generator().manual_seed(0))
runner.forward(ids[:100])
assert runner.compiled
gc.collect(); gc.freeze()
res = {t: [] for t in (1, 2, 4, 8)}
for rep in range(5):
    for t in res:
        for i in range(3): runner.forward(ids[100:100+t], last=t); runner.truncate(100)
        t0 = time.perf_counter()
        for i in range(30): runner.forward(ids[100:100+t], last=t); runner.truncate(100)
        res[t].append((time.perf_counter() - t0) / 30 * 1e3)
prompt = []
for rep in range(3):
    runner.truncate(0)
    t0 = time.perf_counter(); runner.forward(ids[:1000]); prompt.append((time.perf_counter() - t0) * 1e3)
print(" ".join(f"{t}:{statistics.median(v):.3f}" for t, v in res.items()), f"p:{statistics.median(prompt):.1f}")
'''


def run(lib: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, lib], capture_output=True, text=True, check=True).stdout
    line = out.strip().splitlines()[-1]
    print(lib, line, flush=True)
    return {k: float(v) for k, v in re.findall(r"(\w+):([\d.]+)", line)}


def main() -> None:
    a, b = sys.argv[1], sys.argv[2]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    ratios: dict[str, list[float]] = {}
    for i in range(pairs):
        order = (a, b) if i % 2 == 0 else (b, a)
        got = {lib: run(lib) for lib in order}
        for key in got[a]:
            ratios.setdefault(key, []).append(got[b][key] / got[a][key])
    names = {"1": "1 row", "2": "2 rows", "4": "4 rows", "8": "8 rows", "p": "1,000-token prompt"}
    for key, values in ratios.items():
        print(f"{names[key]}: B/A median {statistics.median(values):.3f} ({' '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
