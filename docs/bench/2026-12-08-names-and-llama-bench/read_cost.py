import statistics, time, torch, sys
from specula.engine.api.types import ModelChoice
from specula.engine.cpu import step as compiled
from specula.engine.models.loading import load_model
compiled.prepare(wait=True)
M='/root/.cache/specula-models/'
for name in ('qwen-coder-0.5b','qwen-coder-1.5b'):
    m = load_model(ModelChoice(M+name+'.gguf', step='compiled'))
    r = m.new_runner()
    ids = torch.randint(0, 30000, (300,), generator=torch.Generator().manual_seed(0))
    out = {}
    for n in (1, 8, 32, 51, 128):
        ts=[]
        for _ in range(5):
            r.truncate(0); r.forward(ids[:20])
            b=time.perf_counter(); r.forward(ids[20:20+n]); ts.append(time.perf_counter()-b)
        out[n]=statistics.median(ts)*1000
    print(name, {n: f"{v:.1f} ms ({v/n:.2f}/pos)" for n,v in out.items()}, flush=True)
