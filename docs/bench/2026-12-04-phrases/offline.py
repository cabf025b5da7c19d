"""Offline, before building: tokens per target pass when decoding the bundled model's greedy answers to Spec-Bench
prompts (five per category, both turns of MT-bench's), drafting at every position with prompt lookup, with a
table of the model's own phrases counted from its training answers (training/), or with both (lookup where its
match is 2 tokens or longer, else the phrases). `est` divides the tokens by a pass cost of 1 + 0.08 per drafted
token (this CPU's verify passes at a few hundred tokens of context), drafting free.

    specula generate --model bundled --chat --strategy prompt-lookup --max-new-tokens 192 --json \\
        --prompts FIVE_PER_CATEGORY.jsonl > ANSWERS.jsonl
    python offline.py FIVE_PER_CATEGORY.jsonl ANSWERS.jsonl
"""

import collections
import glob
import json
import lzma
import sys

import numpy as np

from specula.engine.api.types import ModelSpec
from specula.engine.drafters.phrases import PhraseTable
from specula.engine.drafters.prompt_lookup import longest_match
from specula.engine.models.loading import load_model

K = 8
questions = {json.loads(line)["question_id"]: json.loads(line) for line in open(sys.argv[1])}
seqs = []
for path in sorted(glob.glob("training/smollm2-135m-instruct/**/answers-*.jsonl.xz", recursive=True)):
    with lzma.open(path, "rt") as f:
        for line in f:
            d = json.loads(line)
            seqs.append(d["prompt"][-3:] + d["answer"])
table = PhraseTable.from_sequences(seqs)
print(f"table: {len(seqs)} answers, {sum(map(len, seqs))} tokens, {table.runs} runs")
tokenizer = load_model(ModelSpec("bundled")).tokenizer
cases = []
for line in open(sys.argv[2]):
    r = json.loads(line)
    turns = r.get("turns") or [{"text": r["text"], "token_ids": r["token_ids"]}]
    history = []
    for text, turn in zip(questions[r["question_id"]]["turns"], turns):
        history.append({"role": "user", "content": text})
        prompt = tokenizer.encode(tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False),
                                  add_special_tokens=False)
        cases.append((r["category"], list(prompt), turn["token_ids"]))
        history.append({"role": "assistant", "content": turn["text"]})


def lookup(ctx, k=K):
    n, start = longest_match(np.array(ctx, dtype=np.int64), 16)
    return n, (ctx[start : start + min(k, 2 * n)] if n else [])


def both(ctx):
    n, draft = lookup(ctx)
    return draft if n >= 2 else table.draft(ctx[-4:], 4)


policies = {"prompt lookup": lambda c: lookup(c)[1], "phrases (k 4)": lambda c: table.draft(c[-4:], 4),
            "lookup, else phrases": both}
for name, policy in policies.items():
    per = collections.defaultdict(lambda: [0, 0, 0.0])
    for category, prompt, answer in cases:
        i = 0
        while i < len(answer):
            draft = policy(prompt + answer[:i])
            kept = next((j for j, (d, a) in enumerate(zip(draft, answer[i:])) if d != a), min(len(draft), len(answer) - i))
            i += kept + 1
            per[category][0] += kept + 1
            per[category][1] += 1
            per[category][2] += 1 + 0.08 * len(draft)
    tokens, passes, cost = (sum(v[j] for v in per.values()) for j in range(3))
    cats = " ".join(f"{c} {v[0] / v[1]:.2f}" for c, v in per.items())
    print(f"{name:22s} tokens/pass {tokens / passes:.3f}  est {tokens / cost:.3f}  | {cats}")

# where prompt lookup has no match longer than one token: how often the phrases' first token is the answer's, by
# the run it came from and its share of what followed that run
first = collections.defaultdict(lambda: [0, 0])
for category, prompt, answer in cases:
    for i in range(len(answer)):
        ctx = prompt + answer[:i]
        if lookup(ctx)[0] > 1:
            continue
        for n in (4, 3, 2):
            found = table.favourite(ctx[-4:], n)
            if found is not None and found[2] >= 3 and found[1] >= 0.5 * found[2]:
                share = found[1] / found[2]
                band = "0.9+" if share >= 0.9 else "0.7-0.9" if share >= 0.7 else "0.5-0.7"
                first[(n, band)][0] += found[0] == answer[i]
                first[(n, band)][1] += 1
                break
print("first token kept where lookup matches 1 token or none, by run length and share:")
for (n, band), (kept, seen) in sorted(first.items()):
    print(f"  run of {n}, share {band}: {kept / seen:.2f} of {seen}")
