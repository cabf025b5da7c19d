"""auto where it hardly drafts against plain decoding, in one process on the real pair: five rounds of none then auto
(without the members that draft from earlier answers, so that no round drafts the last one), a translation of 96
tokens; the median gap before each plain step, and tokens/s.

    .venv/bin/python docs/bench/2026-12-07-first-answer/plain_cost.py draft
"""
import os, sys, tempfile, statistics
os.environ["SPECULA_DATA_DIR"] = tempfile.mkdtemp()
from specula.engine.serving.session import Session
from specula.engine.api.types import LoadRequest, GenerateRequest, DecodeConfig, ModelSpec
from specula.engine.api.prompts import Message
from specula.engine.api.events import Step
T="/root/.cache/specula-models/qwen-coder-1.5b.gguf"; D="/root/.cache/specula-models/qwen-coder-0.5b.gguf"
use_draft = sys.argv[1] == "draft"
s = Session()
s.load(LoadRequest(ModelSpec(T), draft=D if use_draft else None), lambda m: None)
q = "Translate into German: The train to the coast leaves every hour from the main station, and tickets can be bought on board, though the office by the platform sells them a little cheaper."
rows = {"none": [], "auto": []}; tps = {"none": [], "auto": []}; kinds = {}
for r in range(5):
    for strategy in ("none", "auto"):
        opts = (("skip", "suffix,phrases"),) if strategy == "auto" else ()
        evs = list(s.generate(GenerateRequest((Message("user", q),), strategy, DecodeConfig.for_strategy(strategy, max_new_tokens=96), options=opts)))
        plain = [e for e in evs if isinstance(e, Step) and e.drafted == 0]
        drafted = [e for e in evs if isinstance(e, Step) and e.drafted > 0]
        # a plain step's time: from the previous step's end (elapsed) to its own
        steps = [e for e in evs if isinstance(e, Step)]
        gaps = [b.elapsed_s - a.elapsed_s for a, b in zip(steps, steps[1:]) if b.drafted == 0]
        rows[strategy].append(statistics.median(gaps) * 1000)
        tps[strategy].append(evs[-1].totals.tokens_per_s)
        kinds[strategy] = (len(plain), len(drafted), sum(e.accepted for e in drafted), sum(e.drafted for e in drafted))
    print(r, {k: round(v[-1], 2) for k, v in rows.items()}, {k: round(v[-1], 1) for k, v in tps.items()}, kinds, flush=True)
print("median plain-step ms", {k: round(statistics.median(v), 2) for k, v in rows.items()}, "tok/s", {k: round(statistics.median(v), 1) for k, v in tps.items()})
