"""Plain steps after a pass of several rows, or after a pause, by position after it (the runner alone).

    .venv/bin/python docs/bench/2026-12-05-speedup-truth/after_pass.py
"""
import time, statistics as st, torch, sys
from specula.engine.api.types import ModelSpec
from specula.engine.cpu.step import StepMode
from specula.engine.models.loading import load_model
loaded = load_model(ModelSpec("bundled", "auto", "auto", "auto", "compiled"))
loaded.step = StepMode("compiled")
r = loaded.new_runner()
ids = torch.randint(0, r.vocab_size, (400,))
r.forward(ids[:60])
def plain(L):
    r.truncate(L); t=time.perf_counter(); r.forward(ids[L:L+1]).argmax().item(); return time.perf_counter()-t
def multi(L, n):
    r.truncate(L); r.forward(ids[L:L+n], last=n).argmax().item()
for mode in ["verify4", "plain", "verify4+sleep5ms", "verify8", "verify2"]:
    by = {i: [] for i in range(8)}
    for rep in range(60):
        L = 60 + (rep*3) % 200
        if mode.startswith("verify"):
            n = int(mode[6]); multi(L, n)
            if "sleep" in mode: time.sleep(0.005)
        else: plain(L)
        for i in range(8):
            by[i].append(plain(L+1+i))
    print(mode, " ".join(f"{st.median(v)*1e3:.3f}" for v in by.values()), flush=True)
def spin(s):
    t=time.perf_counter()
    while time.perf_counter()-t<s: pass
for mode in ["plain+spin5ms", "verify8+spin5ms", "verify8+spin20ms", "plain+sleep5ms"]:
    by = {i: [] for i in range(6)}
    for rep in range(60):
        L = 60 + (rep*3) % 200
        if mode.startswith("verify"): multi(L, 8)
        else: plain(L)
        if "spin" in mode: spin(float(mode.split("spin")[1][:-2])/1e3)
        else: time.sleep(0.005)
        for i in range(6):
            by[i].append(plain(L+1+i))
    print(mode, " ".join(f"{st.median(v)*1e3:.3f}" for v in by.values()), flush=True)
