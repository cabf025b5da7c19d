"""The first answers after a load, in one process: python first_inproc.py WARM STRATEGY (WARM: none, drafter,
answer-strat, prep, prep-sleep); prompts from /tmp/p3.jsonl: {"prompt": ...} lines (Spec-Bench qa 321-324)."""
import sys, time, json
from specula.engine.serving.session import Session
from specula.engine.api.types import LoadRequest, ModelSpec, GenerateRequest, DecodeConfig
from specula.engine.api.prompts import conversation
from specula.engine.api.events import Finished
import torch
warm = sys.argv[1]; STRAT = sys.argv[2]
s = Session()
s.load(LoadRequest(ModelSpec("bundled", "auto", "auto", "auto", "compiled"), None, measure_baseline=False))
texts = [json.loads(l)["prompt"] for l in open("/tmp/p3.jsonl")]
if warm == "forward":
    r = s._runner
    ids = torch.randint(0, r.vocab_size, (48,))
    r.forward(ids[:40]); 
    for i in range(8): r.forward(ids[40+i:41+i])
    r.truncate(0)
elif warm == "drafter":
    s.drafter(STRAT, {})
elif warm == "answer-strat":
    list(s.generate(GenerateRequest(conversation("Hi", None, ()), STRAT, DecodeConfig(max_new_tokens=16, seed=0), True, ())))
    s.forget()
elif warm.startswith("prep"):
    s.prepare(STRAT)
    if warm == "prep-sleep": time.sleep(1.0)
elif warm == "answer":
    list(s.generate(GenerateRequest(conversation("Hi", None, ()), "none", DecodeConfig(max_new_tokens=8, seed=0), True, ())))
for t in texts[:3]:
    req = GenerateRequest(conversation(t, None, ()), STRAT, DecodeConfig(max_new_tokens=96, seed=0), True, ())
    t0 = time.perf_counter()
    f = [e for e in s.generate(req) if isinstance(e, Finished)][0]
    print(f"{warm}: ttft {f.totals.prefill_s*1000:.1f} ms  {f.totals.tokens_per_s:.0f} tok/s  wall {1000*(time.perf_counter()-t0):.0f} ms")
