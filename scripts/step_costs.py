"""Time one target forward over 1, 2, 4, ... new tokens at a fixed context length: the cost of a verify step.

usage: python scripts/step_costs.py --model M [--device D] [--dtype T] [--step S[,S...]] [--context N[,N...]]
                                    [--tokens 1,2,4,8,16,32] [--repeats R] [--plain-rounding] [--floor F[,F...]]

The model is loaded the way the engine loads it (specula.engine.models.loading.load_model, then a fresh runner), a
context of N random tokens is prefilled, and then, for every T in --tokens, a forward over T more tokens
(all T rows of logits kept, as a verify pass keeps them) is timed R times, rolling the cache back to N
after each. Prints a Markdown table of the median times and their ratio to a single-token step. On a GPU
every timing is bracketed by torch.cuda.synchronize(), so it measures the work, not the launch.

With several steps or contexts (comma-separated), one table per step and context, from one load.

Speculation pays when a step over k+1 tokens costs much less than k+1 single steps; this table says how
much less on a given machine, model size and dtype.

On a GPU, --step auto (or compiled) runs static steps captured as CUDA graphs (engine/models/static.py; the
capture is waited for before timing, and its time printed), --step static the same steps without graphs,
--step eager neither. --floor F runs static steps in buckets of at least F rows (default: the engine's, 32).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from specula.engine.api.types import ModelChoice
from specula.engine.cpu.step import StepMode
from specula.engine.models.runner import LeanRunner
from specula.engine.models.loading import load_model


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def time_forward(runner, context: int, tokens: torch.Tensor, repeats: int, warmup: int = 2) -> float:
    """Median seconds of runner.forward(tokens) at `context` tokens of cache; leaves the cache at `context`."""
    times = []
    for i in range(warmup + repeats):
        runner.truncate(context)
        synchronize(runner.device)
        t0 = time.perf_counter()
        runner.forward(tokens, last=tokens.shape[0])
        synchronize(runner.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    runner.truncate(context)
    return statistics.median(times)


def runner_for(loaded, step: str, floor: int | None):
    """A fresh runner of `loaded` decoding with `step`; its CUDA graphs captured before it is returned."""
    loaded.step = StepMode(step)
    runner = loaded.new_runner()
    if floor is not None and getattr(runner, "static", False):
        runner = LeanRunner(loaded.model, native=loaded.native, step=loaded.step, static=True, graphs=loaded.graphs,
                             floor=floor)
    note = ""
    if getattr(runner, "graphs", None) is not None:
        t0 = time.perf_counter()
        runner.graphs.wait(timeout=600)
        captured = ", ".join(map(str, runner.graphs.captured)) or "none"
        note = (f"CUDA graphs for steps of {captured} rows captured in {time.perf_counter() - t0:.1f} s"
                + (f" (failed: {runner.graphs.error})" if runner.graphs.error else "") + "\n\n")
    return runner, note


def step_name(runner) -> str:
    if getattr(runner, "static", False):
        return f"{'graphs' if runner.graphs is not None else 'static'} (at least {runner.floor} rows)"
    return "compiled" if getattr(runner, "compiled", False) else "eager"


def table(loaded, runner, context: int, counts: list[int], repeats: int, seed: int, note: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, runner.vocab_size, (context + counts[-1],), generator=gen)
    prompt_times = []
    for _ in range(3):  # the prompt read as an answer reads it (from an empty cache, one pass)
        runner.truncate(0)
        synchronize(runner.device)
        t0 = time.perf_counter()
        runner.forward(ids[:context])
        synchronize(runner.device)
        prompt_times.append(time.perf_counter() - t0)
    times = {t: time_forward(runner, context, ids[context : context + t], repeats) for t in counts}
    one = times[1]
    forward = "lean Llama forward" if loaded.uses_lean_forward else "transformers forward"
    dtype = str(loaded.dtype).removeprefix("torch.")
    print(f"Model: {loaded.name} | device {loaded.device} | dtype {dtype} | weights {loaded.weights} | {forward} "
          f"| step {step_name(runner)} "
          f"| products {'own' if getattr(runner, 'own_products', False) else 'torch'} | context {context} "
          f"| median of {repeats}\n")
    prompt_s = statistics.median(prompt_times)
    print(f"{note}Prompt of {context} tokens read in {prompt_s * 1e3:.0f} ms ({context / prompt_s:.0f} tokens/s, "
          f"median of 3)\n")
    print("| tokens | ms | relative to 1 token | ms per token |")
    print("|---|---|---|---|")
    for t in counts:
        ms = times[t] * 1e3
        print(f"| {t} | {ms:.2f} | {times[t] / one:.2f}x | {ms / t:.2f} |")
    print(flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time target forwards over several new tokens.")
    parser.add_argument("--model", default="bundled", help="bundled, a folder, a .gguf file or a Hub id")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto", choices=["auto", "native", "dequantized"],
                        help="a GGUF's 4-bit weights: native (int4 products) or dequantized to --dtype")
    parser.add_argument("--step", default="auto",
                        help="comma-separated decoding steps among auto, compiled, eager, static (engine/cpu/step.py, "
                             "engine/models/static.py); auto: compiled where it is built (CPU), static steps as CUDA "
                             "graphs (GPU)")
    parser.add_argument("--floor", default="",
                        help="static steps: the fewest rows a step runs as (comma-separated: one runner each; "
                             "default the engine's)")
    parser.add_argument("--products", default="own", choices=["own", "torch"],
                        help="the compiled step's products over a GGUF's blocks: Specula's own or torch's (to compare)")
    parser.add_argument("--context", default="512", help="comma-separated numbers of tokens already in the cache")
    parser.add_argument("--tokens", default="1,2,4,8,16,32", help="comma-separated new-token counts")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per count (the median is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain-rounding", action="store_true",
                        help="single steps use the one-row kernels (the lean forward's consistent rounding off)")
    args = parser.parse_args(argv)
    counts = sorted({1, *(int(t) for t in args.tokens.split(",") if t.strip())})
    contexts = [int(c) for c in args.context.split(",") if c.strip()]
    steps = [s.strip() for s in args.step.split(",") if s.strip()]
    if counts[0] < 1 or not contexts or min(contexts) < 1 or args.repeats < 1:
        parser.error("--tokens, --context and --repeats must be positive")
    if not steps or not set(steps) <= {m.value for m in StepMode}:
        parser.error(f"--step: choose among {', '.join(m.value for m in StepMode)}")

    os.environ["SPECULA_PRODUCTS"] = args.products
    loaded = load_model(ModelChoice(args.model, args.device, args.dtype, args.weights, steps[0]),
                        progress=lambda text: print(text, file=sys.stderr))
    floors = [int(f) for f in args.floor.split(",") if f.strip()] or [None]
    runs = [(step, floor) for step in steps for floor in (floors if step != "eager" else [None])]
    for step, floor in runs:
        runner, note = runner_for(loaded, step, floor)
        if args.plain_rounding and hasattr(runner, "consistent"):
            runner.consistent = False
        for context in contexts:
            if context + counts[-1] > runner.max_len:
                parser.error(f"--context {context} + {counts[-1]} tokens exceeds the {runner.max_len} positions "
                             "the runner holds")
            table(loaded, runner, context, counts, args.repeats, args.seed, note)
        if getattr(runner, "graphs", None) is not None:
            runner.graphs.close()
        del runner
    return 0


if __name__ == "__main__":
    sys.exit(main())
