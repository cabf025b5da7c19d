"""Consistent rounding on the CPU: a position gets the same bits whether it is decoded alone or inside a
verify pass, so greedy speculation reproduces plain decoding in bf16 too, not only in fp32."""

import pytest
import torch

from specula.engine.api.events import Finished
from specula.engine.api.types import K_MAX, DecodeConfig
from specula.engine.models.loading import LoadedModel
from tests.support.tiny import assert_greedy_identity, perturbed, random_medusa_head, tiny_model


def bf16(model) -> LoadedModel:
    return LoadedModel(model.to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16, lean=True)


_BUNDLED: dict[tuple[str, str], LoadedModel] = {}


def bundled(weights: str = "auto", dtype: str = "bf16") -> LoadedModel:
    from specula.engine.api.types import ModelChoice
    from specula.engine.models.loading import load_model

    if (weights, dtype) not in _BUNDLED:
        _BUNDLED[weights, dtype] = load_model(ModelChoice("bundled", device="cpu", dtype=dtype, weights=weights))
    return _BUNDLED[weights, dtype]


@pytest.fixture(scope="module")
def bundled_bf16():
    yield bundled()
    _BUNDLED.clear()


def steps_and_pass(model: LoadedModel, prompt: torch.Tensor, draft: torch.Tensor, consistent: bool):
    """Logits of `draft` fed one token at a time, and fed in one pass, after the same prompt (read once: the
    cache is cut back to it between the two, as a rejected draft's rollback does)."""
    runner = model.new_runner()
    runner.consistent = consistent
    runner.forward(prompt)
    singles = torch.cat([runner.forward(draft[j : j + 1]) for j in range(draft.shape[0])])
    runner.truncate(prompt.shape[0])
    batch = runner.forward(draft, last=draft.shape[0])
    assert runner.compiled == (model.step == "compiled" and consistent)  # the step asked for ran
    return singles, batch


# native: the GGUF's 4-bit blocks through the int4 kernel; dequantized: dense products prepacked for oneDNN,
# whose lone rows round apart for the MLP's 1536-input down projection (not for the 576-input ones)
@pytest.mark.parametrize("step", ["eager", "compiled"])
@pytest.mark.parametrize("weights,dtype", [("auto", "bf16"), ("dequantized", "bf16"), ("dequantized", "fp32")])
def test_single_steps_and_a_verify_pass_give_the_same_bits(bundled_bf16, weights, dtype, step, monkeypatch):
    model = bundled(weights, dtype)
    assert model.new_runner().consistent  # the default on the CPU
    if step == "compiled":
        from specula.engine.cpu import step as compiled

        compiled.prepare(wait=True)
        if compiled.ops() is None:
            pytest.skip(f"the compiled step cannot be built here: {compiled.error()}")
    monkeypatch.setattr(model, "step", step)
    gen = torch.Generator().manual_seed(0)
    for trial in range(8):
        # prompt lengths and draft lengths that cross the attention's key blocks at different offsets
        prompt = torch.randint(0, 49152, (20 + 29 * trial,), generator=gen)
        draft = torch.randint(0, 49152, (1 + trial % 9 if trial < 7 else K_MAX + 1,), generator=gen)  # up to 32 rows
        singles, batch = steps_and_pass(model, prompt, draft, consistent=True)
        assert torch.equal(singles, batch), trial


def test_blocked_attention_matches_the_models_own_attention_within_bf16_precision():
    dense = bundled("dequantized")  # transformers' own forward needs dense weights
    ids = torch.tensor(dense.tokenizer.encode("Speculative decoding drafts, then verifies. " * 6))
    runner = dense.new_runner()
    runner.forward(ids[:20])
    ours = torch.cat([runner.forward(ids[20:21]), runner.forward(ids[21:], last=len(ids) - 21)])
    with torch.no_grad():
        ref = dense.model(ids[None]).logits[0, 20:].float()
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95
    assert (ours - ref).abs().max() < 1.0  # bf16 logits of this model span about +-30


@pytest.mark.parametrize("strategy", ["prompt-lookup", "draft-model", "lookahead", "medusa", "auto"])
def test_greedy_speculation_is_identical_to_plain_decoding_in_bf16(strategy, tmp_path):
    # a random bf16 model: flat distributions with many near ties, where one different bit shows
    target = bf16(tiny_model(vocab=64, layers=4, seed=7))
    draft = bf16(perturbed(tiny_model(vocab=64, layers=4, seed=7), scale=0.05))
    assert not target.new_runner().exact_trees  # tree drafters send chains here
    options = {}
    if strategy in ("medusa", "auto"):
        folder = random_medusa_head(target, tmp_path)
        options = {"head": str(folder)} if strategy == "medusa" else {"heads": (str(folder),)}
    assert_greedy_identity(target, draft, strategy, options, trials=10, longest_prompt=60, max_new_tokens=80)


@pytest.mark.parametrize("prompt", [
    "Rewrite this sentence in the past tense: The cat sits on the mat and watches the birds while the dog sleeps.",
    "Summarize: The city council met on Tuesday to discuss the new park. Members agreed the park needs more "
    "trees, better lighting and a playground. The mayor said work on the park will start in the spring.",
    "Translate to French: The weather is nice today and we are going to the beach with our friends.",
])
def test_prompt_lookup_gives_the_plain_answer_on_the_bundled_model_in_bf16(bundled_bf16, prompt):
    from specula.engine.api.prompts import conversation
    from specula.engine.api.types import GenerateRequest
    from specula.engine.serving.session import Session

    session = Session()
    session.use(bundled_bf16)
    outs = {}
    for name, adaptive in (("none", False), ("prompt-lookup", False), ("prompt-lookup", True)):
        request = GenerateRequest(conversation(prompt), name, DecodeConfig(k=6, adaptive_k=adaptive, max_new_tokens=80))
        outs[name, adaptive] = [e for e in session.generate(request) if isinstance(e, Finished)][0]
    base = outs["none", False]
    assert base.totals.new_tokens > 8
    for key in (("prompt-lookup", False), ("prompt-lookup", True)):
        assert outs[key].token_ids == base.token_ids, key
        assert outs[key].totals.accepted > 0
