"""On an NVIDIA GPU, greedy speculation still reproduces plain greedy decoding token for token (fp32).

Skipped where torch sees no CUDA device. Run with `pytest -m cuda` (scripts/gpu_checks.sh does).
"""

import pytest
import torch

from specula.engine.api.events import Finished
from specula.engine.api.types import DecodeConfig, ModelChoice
from specula.engine.cpu.step import StepMode
from specula.engine.decoding.loop import generate
from specula.engine.drafters import DRAFTERS, build_drafter
from specula.engine.models.loading import LoadedModel, load_model
from tests.engine.test_lossless import run
from tests.support.tiny import assert_greedy_identity, head_options, perturbed, tiny_model

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU: torch.cuda.is_available() is False"),
]

CUDA = torch.device("cuda")
STRATEGIES = ("prompt-lookup", "draft-model")


def on_cuda(model) -> LoadedModel:
    return LoadedModel(model.to(CUDA), None, "tiny", CUDA, torch.float32)


@pytest.fixture(scope="module")
def cuda_models():
    target = tiny_model(vocab=64, layers=4, seed=0)
    draft = perturbed(target, scale=0.05)
    return on_cuda(target), on_cuda(draft)


def test_tiny_models_really_run_on_the_gpu(cuda_models):
    target, draft = cuda_models
    assert target.new_runner().device.type == "cuda"
    assert next(draft.model.parameters()).device.type == "cuda"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_matches_plain_decoding_on_cuda(cuda_models, strategy):
    target, draft = cuda_models
    gen = torch.Generator().manual_seed(7)
    drafted = accepted = 0
    for trial in range(10):
        length = int(torch.randint(1, 30, (1,), generator=gen))
        prompt = torch.randint(0, 64, (length,), generator=gen).tolist()
        if trial % 2 == 0:
            prompt = prompt[:6] * 3  # repeats give prompt lookup something to copy
        k = 1 + trial % 7
        base = run(target, draft, "none", prompt, max_new_tokens=50)[-1]
        spec = run(target, draft, strategy, prompt, k=k, adaptive_k=trial % 3 == 0, max_new_tokens=50, seed=trial)[-1]
        assert isinstance(spec, Finished)
        assert spec.token_ids == base.token_ids, (strategy, prompt, k)
        drafted += spec.totals.drafted
        accepted += spec.totals.accepted
    assert drafted > 0 and accepted > 0  # speculation really happened


def test_a_model_folder_loads_on_cuda_and_stays_lossless(tiny_folder):
    target = load_model(ModelChoice(str(tiny_folder), device="cuda", dtype="fp32"))
    draft = load_model(ModelChoice(str(tiny_folder), device="cuda", dtype="fp32"))
    assert target.device.type == "cuda" and next(target.model.parameters()).device.type == "cuda"
    prompt = target.tokenizer.encode("one two three one two three one two")
    config = DecodeConfig(k=4, max_new_tokens=32)
    outputs = {}
    for strategy in ("none", *STRATEGIES):
        drafter = build_drafter(strategy, target, draft)
        events = list(generate(target.new_runner(), drafter, prompt, config, stop_ids=target.eos_ids, strategy=strategy))
        outputs[strategy] = events[-1].token_ids
    assert outputs["prompt-lookup"] == outputs["none"]
    assert outputs["draft-model"] == outputs["none"]


def test_a_gguf_goes_to_the_gpu_a_tensor_at_a_time_and_stays_lossless(tmp_path, monkeypatch):
    """A GGUF on a GPU: every tensor dequantized alone straight onto the device (the host never holds the model in
    full precision), the file's own weights, and speculation exact over them."""
    from specula.engine.models import gguf
    from tests.support.gguf_files import tiny_llama, write_gguf

    path = write_gguf(tmp_path / "m.gguf", tiny_llama(seed=9), "Q4_K")
    host = []
    real = gguf.GGUFFile.dequantize
    monkeypatch.setattr(gguf.GGUFFile, "dequantize", lambda self, name, dtype, rows=None: (
        host.append(name) or real(self, name, dtype, rows)))
    target = load_model(ModelChoice(str(path), device="cuda", dtype="fp32"))
    assert target.native is None and len(host) == len(set(host))  # each tensor once, one at a time
    assert all(p.device.type == "cuda" and not p.is_meta for p in target.model.parameters())
    dense = load_model(ModelChoice(str(path), device="cpu", dtype="fp32"))
    for (name, p), (_, q) in zip(target.model.named_parameters(), dense.model.named_parameters()):
        assert torch.equal(p.cpu(), q), name
    prompt = target.tokenizer.encode("one two three one two three one two")
    none = list(generate(target.new_runner(), build_drafter("none", target, None), prompt,
                         DecodeConfig(k=4, max_new_tokens=32)))[-1].token_ids
    lookup = list(generate(target.new_runner(), build_drafter("prompt-lookup", target, None), prompt,
                           DecodeConfig(k=4, max_new_tokens=32)))[-1].token_ids
    assert lookup == none


# Static steps and CUDA graphs (models/static.py): what the GPU runs unless --step eager


def static_on_cuda(model, dtype: torch.dtype, step: str = "auto") -> LoadedModel:
    loaded = LoadedModel(model.to(CUDA, dtype), None, "tiny", CUDA, dtype)
    loaded.step = StepMode(step)
    return loaded


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("strategy", sorted(set(DRAFTERS) - {"none"}))
def test_greedy_speculation_through_graphs_is_plain_decoding_on_cuda(dtype, strategy, tmp_path):
    target = static_on_cuda(tiny_model(vocab=64, layers=4, seed=7), dtype)
    draft = static_on_cuda(perturbed(tiny_model(vocab=64, layers=4, seed=7), scale=0.05), dtype)
    assert target.graphs and target.new_runner().static
    options = head_options(target, strategy, tmp_path)
    assert_greedy_identity(target, draft, strategy, options, trials=6, longest_prompt=40, max_new_tokens=48)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_single_steps_and_a_verify_pass_give_the_same_bits_through_graphs(dtype):
    target = static_on_cuda(tiny_model(vocab=256, layers=4, seed=3), dtype)
    one, many = target.new_runner(), target.new_runner()
    for runner in (one, many):
        assert runner.graphs.wait(timeout=300), runner.graphs.error
        assert runner.graphs.captured == (32, 64)
    gen = torch.Generator().manual_seed(0)
    for trial in range(6):
        prompt = torch.randint(0, 256, (10 + 23 * trial,), generator=gen)
        draft = torch.randint(0, 256, (1 + 5 * trial,), generator=gen)
        for runner in (one, many):
            runner.truncate(0)
            runner.forward(prompt)
        singles = torch.cat([one.forward(draft[j : j + 1]) for j in range(draft.shape[0])])
        batch = many.forward(draft, last=draft.shape[0])
        assert torch.equal(singles, batch), trial


def test_graph_replays_give_the_eager_static_steps_bits():
    model = tiny_model(vocab=256, layers=4, seed=4)
    graphs = static_on_cuda(model, torch.bfloat16, "auto").new_runner()
    assert graphs.graphs.wait(timeout=300), graphs.graphs.error
    eager = static_on_cuda(model, torch.bfloat16, "static").new_runner()
    assert eager.graphs is None
    ids = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(1))
    for runner in (graphs, eager):
        runner.forward(ids[:20])
    for t in (1, 4, 16, 33):
        tokens = ids[20 : 20 + t]
        assert torch.equal(graphs.forward(tokens, last=t), eager.forward(tokens, last=t)), t
