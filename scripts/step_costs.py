"""Time one target forward over 1, 2, 4, ... new tokens at a fixed context length: the cost of a verify step.

usage: python scripts/step_costs.py --model M [--device D] [--dtype T] [--step S] [--context N] [--tokens 1,2,4,8,16,32]
                                    [--repeats R] [--plain-rounding]

The model is loaded the way the engine loads it (specula.engine.models.loading.load_model, then a fresh runner), a
context of N random tokens is prefilled, and then, for every T in --tokens, a forward over T more tokens
(all T rows of logits kept, as a verify pass keeps them) is timed R times, rolling the cache back to N
after each. Prints a Markdown table of the median times and their ratio to a single-token step. On a GPU
every timing is bracketed by torch.cuda.synchronize(), so it measures the work, not the launch.

Speculation pays when a step over k+1 tokens costs much less than k+1 single steps; this table says how
much less on a given machine, model size and dtype.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from specula.engine.api.types import ModelSpec
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time target forwards over several new tokens.")
    parser.add_argument("--model", default="bundled", help="bundled, a folder, a .gguf file or a Hub id")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--weights", default="auto", choices=["auto", "native", "dequantized"],
                        help="a GGUF's 4-bit weights: native (int4 products) or dequantized to --dtype")
    parser.add_argument("--step", default="auto", choices=["auto", "compiled", "eager"],
                        help="the decoding step (engine/cpu/step.py); auto: compiled where it is built")
    parser.add_argument("--products", default="own", choices=["own", "torch"],
                        help="the compiled step's products over a GGUF's blocks: Specula's own or torch's (to compare)")
    parser.add_argument("--context", type=int, default=512, help="tokens already in the cache")
    parser.add_argument("--tokens", default="1,2,4,8,16,32", help="comma-separated new-token counts")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per count (the median is kept)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain-rounding", action="store_true",
                        help="single steps use the one-row kernels (the lean forward's consistent rounding off)")
    args = parser.parse_args(argv)
    counts = sorted({1, *(int(t) for t in args.tokens.split(",") if t.strip())})
    if counts[0] < 1 or args.context < 1 or args.repeats < 1:
        parser.error("--tokens, --context and --repeats must be positive")

    os.environ["SPECULA_PRODUCTS"] = args.products
    loaded = load_model(ModelSpec(args.model, args.device, args.dtype, args.weights, args.step),
                        progress=lambda text: print(text, file=sys.stderr))
    runner = loaded.new_runner()
    if args.plain_rounding and hasattr(runner, "consistent"):
        runner.consistent = False
    if args.context + counts[-1] > runner.max_len:
        parser.error(f"--context {args.context} + {counts[-1]} tokens exceeds the model's window of {runner.max_len}")
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, runner.vocab_size, (args.context + counts[-1],), generator=gen)
    prompt_times = []
    for _ in range(3):  # the prompt read as an answer reads it (from an empty cache, one pass)
        runner.truncate(0)
        synchronize(runner.device)
        t0 = time.perf_counter()
        runner.forward(ids[: args.context])
        synchronize(runner.device)
        prompt_times.append(time.perf_counter() - t0)

    times = {t: time_forward(runner, args.context, ids[args.context : args.context + t], args.repeats) for t in counts}
    one = times[1]
    forward = "lean Llama forward" if loaded.uses_lean_forward else "transformers forward"
    dtype = str(loaded.dtype).removeprefix("torch.")
    print(f"Model: {loaded.name} | device {loaded.device} | dtype {dtype} | weights {loaded.weights} | {forward} "
          f"| step {'compiled' if getattr(runner, 'compiled', False) else 'eager'} "
          f"| products {'own' if getattr(runner, 'own_products', False) else 'torch'} | context {args.context} "
          f"| median of {args.repeats}\n")
    prompt_s = statistics.median(prompt_times)
    print(f"Prompt of {args.context} tokens read in {prompt_s * 1e3:.0f} ms ({args.context / prompt_s:.0f} tokens/s, "
          f"median of 3)\n")
    print("| tokens | ms | relative to 1 token | ms per token |")
    print("|---|---|---|---|")
    for t in counts:
        ms = times[t] * 1e3
        print(f"| {t} | {ms:.2f} | {times[t] / one:.2f}x | {ms / t:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
