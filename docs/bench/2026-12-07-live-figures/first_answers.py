"""Time the first answers after a load (as serve loads: prepare with the strategy), then the same kind again."""
import sys, time, json
from specula.engine.api.types import LoadRequest, ModelSpec, GenerateRequest, DecodeConfig
from specula.engine.api.prompts import Message
from specula.engine.serving.session import Session
from specula.engine.api.events import Finished, Step

model = sys.argv[1]; strategy = sys.argv[2]
qs = ["Write a Python function that checks whether a string is a palindrome.",
      "Explain what a hash table is in three sentences.",
      "List five fruits and their colours.",
      "Write a Python function that reverses a linked list.",
      "Explain recursion to a child."]
s = Session()
t0 = time.perf_counter()
s.load(LoadRequest(ModelSpec(model, "cpu", "auto", "auto", "auto"), prepare=GenerateRequest((), strategy, DecodeConfig.for_strategy(strategy, None))),
       progress=lambda m: print("  load:", m, f"{time.perf_counter()-t0:.1f}s", file=sys.stderr))
print(f"loaded in {time.perf_counter()-t0:.1f}s")
for rnd in range(2):
    for q in qs:
        cfg = DecodeConfig.for_strategy(strategy, None)
        from dataclasses import replace
        cfg = replace(cfg, max_new_tokens=96)
        t = time.perf_counter(); first = None; steps = 0
        for ev in s.generate(GenerateRequest((Message("user", q),), strategy, cfg, True)):
            if isinstance(ev, Step):
                steps += 1
                if first is None: first = time.perf_counter() - t
            if isinstance(ev, Finished):
                fin = ev
        total = time.perf_counter() - t
        tt = fin.totals
        print(f"round {rnd} {q[:30]!r:34} first token {first*1000:6.0f} ms  total {total:5.2f}s  {tt.new_tokens} tok  {tt.tokens_per_s:6.1f} tok/s  speedup {fin.speedup}")
