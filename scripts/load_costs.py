"""Time and memory of loading a model as a user's first start does, each load in a fresh process.

usage: python scripts/load_costs.py MODEL [MODEL...] [--runs N] [--dtype bf16] [--tokens 16] [--cold]

For each model and run, a new Python process imports Specula, loads the model (`load_model`, the compiled step
already built for this machine), reads a 32-token prompt and decodes --tokens tokens with `none`; it reports
the seconds to the model being ready, to the last token, and the process's peak and final resident memory
(VmHWM, VmRSS, and of the latter what is not the file's pages, RssAnon, from /proc). --cold drops the page cache before each run (root only: the first start after a
download or a reboot reads the file from disk). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from specula.engine.api.types import DecodeConfig, ModelChoice
from specula.engine.decoding.loop import generate
from specula.engine.drafters import build_drafter
from specula.engine.models.loading import load_model

def memory():
    status = open(f"/proc/{os.getpid()}/status").read()
    field = lambda key: int(status.split(key + ":")[1].split()[0]) * 1024
    return field("VmHWM"), field("VmRSS"), field("RssAnon")

model, dtype, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
loaded = load_model(ModelChoice(model, device="cpu", dtype=dtype, step="compiled"))
ready = time.perf_counter() - t0
peak_load, _, _ = memory()
prompt = torch.randint(100, 1000, (32,), generator=torch.Generator().manual_seed(0)).tolist()
drafter = build_drafter("none", loaded, None)
finished = list(generate(loaded.new_runner(), drafter, prompt, DecodeConfig(k=1, max_new_tokens=tokens)))[-1]
done = time.perf_counter() - t0
peak, rss, anon = memory()
print(json.dumps({"ready_s": ready, "done_s": done, "peak_load": peak_load, "peak": peak, "rss": rss, "anon": anon,
                  "weights": loaded.weights, "tokens": len(finished.token_ids)}))
"""


def drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--cold", action="store_true")
    args = parser.parse_args()
    print("| model | size | weights | run | ready (s) | to token %d (s) | peak while loading | peak | RSS after "
          "| of which anonymous |" % args.tokens)
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models:
        size = Path(model).stat().st_size / 1e9 if Path(model).is_file() else float("nan")
        for run in range(args.runs):
            cold = args.cold and drop_page_cache()
            out = subprocess.run([sys.executable, "-c", CHILD, model, args.dtype, str(args.tokens)],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"| {Path(model).name} | {size:.2f} GB | | {run + 1} | failed: {out.stderr.strip().splitlines()[-1]} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
            print(f"| {Path(model).name} | {size:.2f} GB | {r['weights']} | {run + 1}{' (cold)' if cold else ''} | "
                  f"{r['ready_s']:.1f} | {r['done_s']:.1f} | {gb(r['peak_load'])} | {gb(r['peak'])} | {gb(r['rss'])} | "
                  f"{gb(r['anon'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
