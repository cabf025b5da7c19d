import sys, time, importlib
old = sys.argv[1] == "old"
if old:
    # the old tree's package ahead of the editable install
    sys.meta_path = [m for m in sys.meta_path if "editable" not in type(m).__module__ and "editable" not in str(m)]
    sys.path.insert(0, "/tmp/oldpkg")
import specula.engine, torch
print(specula.engine.__file__)
from specula.engine.cpu import step
step.prepare(wait=True)
from specula.engine.api.types import ModelSpec
from specula.engine.models.loading import load_model
t = load_model(ModelSpec("bundled", device="cpu", dtype="bf16", step="compiled"))
r = t.new_runner()
ids = torch.arange(100, 200)
best = {}
for rep in range(7):
    r.truncate(0); r.forward(ids[:80])
    t0 = time.perf_counter()
    for i in range(80, 100): r.forward(ids[i:i+1])
    one = (time.perf_counter() - t0) / 20
    r.truncate(90)
    t0 = time.perf_counter()
    for _ in range(10): r.forward(ids[90:98], last=8); r.truncate(90)
    eight = (time.perf_counter() - t0) / 10
    best.setdefault("1", []).append(one); best.setdefault("8", []).append(eight)
import statistics
print(sys.argv[1], "step ms %.2f, 8-row pass ms %.2f" % (1000*statistics.median(best["1"]), 1000*statistics.median(best["8"])), r.compiled)
