"""Logits of the bundled model and tiny models through the compiled step, for bit-for-bit comparison before/after."""
import sys, torch
sys.path.insert(0, "/work/main")
from specula.engine.cpu import step
step.prepare(wait=True)
from specula.engine.api.types import ModelSpec
from specula.engine.models.loading import load_model
from specula.engine.decoding.tree import TokenTree
from specula.engine.models.llama import step_rows
from tests.support.tiny import native, tiny_model

out = {}
def run(name, target, ctxs=(40, 301, 700)):
    target.step = "compiled"
    ids = torch.randint(5, 1000 if name == "bundled" else 60, (max(ctxs) + 30,), generator=torch.Generator().manual_seed(2))
    for c in ctxs:
        r = target.new_runner()
        r.forward(ids[:1]); assert r.compiled
        r.forward(ids[1:c], last=c - 1)
        out[f"{name}-{c}-steps"] = torch.cat([r.forward(ids[i:i+1]) for i in range(c, c + 6)])
        r.truncate(c)
        out[f"{name}-{c}-chain"] = r.forward(ids[c:c+9], last=9)
        r.truncate(c)
        out[f"{name}-{c}-tree"] = r.forward(torch.tensor([int(ids[c]), 7, int(ids[c+1]), int(ids[c+2]), 9]), last=5,
                                            tree=TokenTree((-1, 0, 0, 2, 0)))
    rs = []
    for c in ctxs:
        r = target.new_runner(); r.forward(ids[:1]); r.forward(ids[1:c], last=1); rs.append(r)
    out[f"{name}-rows"] = step_rows(rs, ids[:len(rs)])
run("bundled", load_model(ModelSpec("bundled", device="cpu", dtype="bf16", step="compiled")))
for fam, hd in (("llama", 64), ("gemma3", 256), ("qwen3", 128), ("llama", 16), ("phi3", 16)):
    run(f"{fam}{hd}", native(tiny_model(vocab=64, layers=3, seed=6, family=fam, head_dim=hd, window=64, max_pos=1024)))
torch.save(out, sys.argv[1])
print(len(out), "tensors")
