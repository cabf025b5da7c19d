"""How close a GGUF's native 4-bit products are to its dequantized weights, and how often the two agree.

usage: python scripts/weights_agreement.py PROMPTS.jsonl [--model bundled] [--limit-per-category 2]
                                           [--max-new-tokens 96]

1. Weights: for every Q4 projection, the weights the int4 kernel computes with (scale and zero rounded
   to bf16) against the file's exact fp32 weights (what transformers dequantizes): the largest error in
   units of the group's step d, and the RMS error relative to the RMS weight.
2. Logits: the first turn of each prompt and the dequantized model's answer, teacher-forced through both
   models (the answer in verify-sized passes, as decoding feeds it): how often the argmax agrees, and
   the logit differences.
3. Greedy answers: each model's own greedy answer (`none`, chat template): identical answers, and the
   tokens the two have in common before they part.
Prints Markdown.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from specula.engine.api.events import Finished
from specula.engine.api.prompts import conversation, encode
from specula.engine.api.types import DecodeConfig, GenerateRequest, ModelChoice
from specula.engine.cli.bench.run import load_items
from specula.engine.models.loading import load_model
from specula.engine.serving.session import Session


def weight_errors(native) -> tuple[float, float, float]:
    """Largest error of the int4 kernel's weights in units of d; RMS errors (relative to the RMS weight)
    of the int4 kernel's weights and of the dequantized bf16 weights, both against the file's exact ones."""
    worst = 0.0
    err2 = dense2 = ref2 = 0.0
    for blocks in native.blocks.values():
        exact = blocks.dequantize()
        used = blocks.dequantize(torch.bfloat16)
        step = blocks.scale.abs().repeat_interleave(32, dim=1).clamp_min(1e-12)
        worst = max(worst, float(((used - exact).abs() / step).max()))
        err2 += float((used - exact).pow(2).sum())
        dense2 += float((exact.to(torch.bfloat16).float() - exact).pow(2).sum())
        ref2 += float(exact.pow(2).sum())
    return worst, (err2 / ref2) ** 0.5, (dense2 / ref2) ** 0.5


def forced(model, prompt: torch.Tensor, answer: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """Logits at every answer position, the answer fed in verify-sized passes after the prompt (as
    decoding feeds it: the prompt through the prompt path, the answer through the step products)."""
    runner = model.new_runner()
    out = [runner.forward(prompt)]
    for i in range(0, len(answer) - 1, chunk):
        part = answer[i : min(i + chunk, len(answer) - 1)]
        out.append(runner.forward(part, last=len(part)))
    return torch.cat(out)  # (len(answer), V): the logits that predicted each answer token


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("prompts")
    ap.add_argument("--model", default="bundled")
    ap.add_argument("--limit-per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    native = load_model(ModelChoice(args.model, "cpu", "bf16", "native"))
    dense = load_model(ModelChoice(args.model, "cpu", "bf16", "dequantized"))
    worst, rel, dense_rel = weight_errors(native.native)
    print(f"## {native.name}: {native.native.summary}\n")
    print(f"Weights the int4 kernel computes with vs the file's exact weights: largest error {worst:.3f} of the "
          f"group's step d; RMS error {100 * rel:.3f}% of the RMS weight (the dequantized bf16 weights: "
          f"{100 * dense_rel:.3f}%).\n")

    items = load_items(Path(args.prompts), None, args.limit_per_category)
    sessions = {}
    for name, model in (("native", native), ("dequantized", dense)):
        sessions[name] = Session()
        sessions[name].use(model)
    agree = total = 0
    diffs: list[float] = []
    same = 0
    common: list[float] = []
    for item in items:
        messages = conversation(item.turns[0])
        ids = torch.tensor(encode(native.tokenizer, messages, True))
        request = GenerateRequest(messages, "none", DecodeConfig(max_new_tokens=args.max_new_tokens))
        answers = {}
        for name, session in sessions.items():
            answers[name] = [e for e in session.generate(request) if isinstance(e, Finished)][0].token_ids
        a, b = answers["native"], answers["dequantized"]
        same += a == b
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        common.append(n / max(1, max(len(a), len(b))))
        answer = torch.tensor(list(b), dtype=torch.long)
        logits = {name: forced(model, ids, answer) for name, model in (("native", native), ("dequantized", dense))}
        agree += int((logits["native"].argmax(-1) == logits["dequantized"].argmax(-1)).sum())
        total += len(answer)
        diffs.append(float((logits["native"] - logits["dequantized"]).abs().mean()))
    print(f"Teacher-forced over {len(items)} answers ({total} positions): argmax agrees at "
          f"{100 * agree / total:.1f}% of positions; mean |logit difference| {statistics.mean(diffs):.3f} "
          f"(per prompt {min(diffs):.3f}-{max(diffs):.3f}).\n")
    print(f"Greedy answers ({args.max_new_tokens} new tokens): {same}/{len(items)} identical; on average the "
          f"first {100 * statistics.mean(common):.0f}% of an answer is common before they part.")


if __name__ == "__main__":
    main()
