import sys, time, statistics, torch
sys.path.insert(0, "/work/main")
from specula.engine.cpu import step
step.prepare(wait=True)
from specula.engine.api.types import ModelSpec
from specula.engine.models.loading import load_model
t = load_model(ModelSpec("bundled", device="cpu", dtype="bf16", step="compiled"))
r = t.new_runner()
ids = torch.randint(5, 1000, (4100,), generator=torch.Generator().manual_seed(1))
r.forward(ids[:1]); r.forward(ids[1:4000], last=1)
one, eight = [], []
for rep in range(15):
    r.truncate(4000)
    t0 = time.perf_counter()
    for i in range(4000, 4010): r.forward(ids[i:i+1])
    one.append((time.perf_counter() - t0) / 10)
    r.truncate(4000)
    t0 = time.perf_counter()
    for _ in range(5): r.forward(ids[4000:4008], last=8); r.truncate(4000)
    eight.append((time.perf_counter() - t0) / 5)
print(sys.argv[1], "ctx4000 step %.2f ms, 8-row pass %.2f ms" % (1000 * statistics.median(one), 1000 * statistics.median(eight)))
