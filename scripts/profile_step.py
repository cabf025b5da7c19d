"""Where a decoding step's time goes: drafting, the target's forward, acceptance, cache rollback,
detokenisation, and the rest (Python bookkeeping, events), per strategy.

usage: python scripts/profile_step.py PROMPTS.jsonl [--model bundled] [--dtype bf16] [--limit 6]
       [--strategies none,prompt-lookup] [--max-new-tokens 96]

Runs the first turn of the first prompt of each category (up to --limit prompts) with the chat
template, wraps the engine's parts with timers and prints a Markdown table of milliseconds per step.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

import specula.engine.decoding.loop as decoder
from specula.engine.api.events import Finished
from specula.engine.api.prompts import conversation
from specula.engine.api.types import GenerateRequest, LoadRequest, ModelChoice
from specula.engine.cli.common import read_prompts
from specula.engine.decoding.detok import Detokenizer
from specula.engine.serving.session import Session

TIMES: collections.Counter = collections.Counter()


def timed(name, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[name] += time.perf_counter() - t0
    return wrapper


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts", type=Path)
    ap.add_argument("--model", default="bundled")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("--strategies", default="none,prompt-lookup")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()

    session = Session()
    session.load(LoadRequest(ModelChoice(args.model, "cpu", args.dtype), measure_baseline=False))
    runner = session._runner
    runner.forward = timed("target forward", runner.forward)
    runner.truncate = timed("cache rollback", runner.truncate)
    decoder.verify = timed("acceptance (verify)", decoder.verify)
    Detokenizer.add = timed("detokenisation", Detokenizer.add)
    seen, items = set(), []
    for item in read_prompts(args.prompts):
        if item.category not in seen and len(items) < args.limit:
            seen.add(item.category)
            items.append(item)

    print("| strategy | steps | ms/step: draft | target forward | acceptance | rollback | detok | other | total | tokens/step |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for strategy in args.strategies.split(","):
        drafter = session.drafter(strategy, {})
        TIMES.clear()
        steps = tokens = 0
        wall = prefill = 0.0
        original = type(drafter).propose
        type(drafter).propose = timed("draft", original)
        try:
            for item in items:
                request = GenerateRequest(conversation(item.turns[0]), strategy,
                                          decoder.DecodeConfig(k=decoder_k(strategy), max_new_tokens=args.max_new_tokens), True)
                f = [e for e in session.generate(request) if isinstance(e, Finished)][0]
                steps += f.totals.steps
                tokens += f.totals.new_tokens - 1
                wall += f.totals.wall_s
                prefill += f.totals.prefill_s
        finally:
            type(drafter).propose = original
        # the prefill's forward is not a step
        TIMES["target forward"] -= prefill
        parts = ["draft", "target forward", "acceptance (verify)", "cache rollback", "detokenisation"]
        decode_s = wall - prefill
        other = decode_s - sum(TIMES[p] for p in parts)
        cells = [f"{1000 * TIMES[p] / steps:.2f}" for p in parts] + [f"{1000 * other / steps:.2f}", f"{1000 * decode_s / steps:.2f}"]
        print(f"| {strategy} | {steps} | " + " | ".join(cells) + f" | {tokens / steps:.2f} |")


def decoder_k(strategy: str) -> int:
    from specula.engine.api.strategies import default_k

    return default_k(strategy)


if __name__ == "__main__":
    main()
