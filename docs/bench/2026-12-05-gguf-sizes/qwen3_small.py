import time, torch
from transformers import Qwen3Config, Qwen3ForCausalLM, LlamaConfig, LlamaForCausalLM
from specula.engine.models.loading import LoadedModel
from specula.engine.cpu import step
step.prepare(wait=True)
res = {}
for name, (C, M) in {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}.items():
    cfg = C(vocab_size=49152, hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
            num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = M(cfg).eval().to(torch.bfloat16)
    for mode in ("eager", "compiled"):
        target = LoadedModel(model, None, name, torch.device("cpu"), torch.bfloat16, step=mode)
        r = target.new_runner()
        r.forward(torch.arange(1, 40))
        for i in range(20): r.forward(torch.tensor([5]))
        best = []
        for rep in range(5):
            r.truncate(39)
            t = time.perf_counter()
            for i in range(50): r.forward(torch.tensor([5]))
            best.append((time.perf_counter() - t) / 50)
        best.sort()
        print(name, mode, "compiled" if r.compiled else "eager", "%.2f ms/step" % (best[2] * 1e3))
