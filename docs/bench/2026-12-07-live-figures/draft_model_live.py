import sys, time
from dataclasses import replace
from specula.engine.api.types import LoadRequest, ModelSpec, GenerateRequest, DecodeConfig
from specula.engine.api.prompts import Message
from specula.engine.serving.session import Session
from specula.engine.api.events import Finished
T = "/root/.cache/specula-models/qwen-coder-1.5b.gguf"; D = "/root/.cache/specula-models/qwen-coder-0.5b.gguf"
qs = ["Write a Python function that checks whether a string is a palindrome.",
      "Explain what a hash table is in three sentences.",
      "Write a Python class for a stack with push, pop and peek."]
s = Session()
s.load(LoadRequest(ModelSpec(T, "cpu", "auto", "auto", "auto"), draft=D, prepare=GenerateRequest((), "draft-model", DecodeConfig.for_strategy("draft-model", None))))
for q in qs:
    rates = {}
    for strat in ("none", "draft-model"):
        cfg = replace(DecodeConfig.for_strategy(strat, None), max_new_tokens=128)
        for ev in s.generate(GenerateRequest((Message("user", q),), strat, cfg, True)):
            if isinstance(ev, Finished): fin = ev
        t = fin.totals
        rates[strat] = t.tokens_per_s
        print(f"{strat:12} {q[:28]!r:32} {t.new_tokens} tok {t.tokens_per_s:6.2f} tok/s live {fin.speedup} acc {t.acceptance_rate} per step {t.mean_accepted_length}", flush=True)
    print(f"  measured {rates['draft-model']/rates['none']:.2f}x", flush=True)
