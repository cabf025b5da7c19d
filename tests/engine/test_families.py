"""Families Specula's own forward does not run yet go through transformers' forward (models/hf.py), and
speculation there is exact all the same: every call has the rows from which a row's bits stop depending on
the call's size, measured where the model loads; the load says in one line which path the model takes."""

import pytest
import torch

from specula.engine.models import hf
from specula.engine.models.loading import LoadedModel
from tests.support.tiny import assert_greedy_identity, perturbed


def _gemma3(sliding_window: int = 8, seed: int = 0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                              sliding_window=sliding_window, query_pre_attn_scalar=16, sliding_window_pattern=2)
    torch.manual_seed(seed)
    return Gemma3ForCausalLM(config).eval()


def _gemma2(seed: int = 0):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                          sliding_window=8, query_pre_attn_scalar=16, final_logit_softcapping=30.0,
                          attn_logit_softcapping=50.0)
    torch.manual_seed(seed)
    return Gemma2ForCausalLM(config).eval()


def _neox(seed: int = 0):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    config = GPTNeoXConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                           num_attention_heads=4, max_position_embeddings=512, rotary_pct=0.5)
    torch.manual_seed(seed)
    return GPTNeoXForCausalLM(config).eval()


def _stablelm(seed: int = 0):
    from transformers import StableLmConfig, StableLmForCausalLM

    config = StableLmConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                            partial_rotary_factor=0.25)
    torch.manual_seed(seed)
    return StableLmForCausalLM(config).eval()


FAMILIES = {"stablelm": _stablelm, "gpt_neox": _neox}  # layer norms, partial rotary: transformers' forward


def _sharpen(model):
    with torch.no_grad():  # sharper distributions: greedy text with structure, drafts accepted
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def _loaded(model, dtype: torch.dtype) -> LoadedModel:
    return LoadedModel(model.to(dtype), None, "tiny", torch.device("cpu"), dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("strategy", ["prompt-lookup", "draft-model"])
def test_speculation_through_transformers_forward_is_plain_decoding(family, dtype, strategy):
    model = _sharpen(FAMILIES[family]())
    target = _loaded(model, dtype)
    assert not target.uses_lean_forward and isinstance(target.new_runner(), hf.HFRunner)
    draft = _loaded(perturbed(model), dtype) if strategy == "draft-model" else None
    assert_greedy_identity(target, draft, strategy, {}, trials=4, longest_prompt=40, max_new_tokens=40)


def test_a_verify_pass_gets_the_bits_of_single_steps_at_every_length():
    """transformers' kernels give a pass's rows other bits than single steps at some lengths of the cache (this
    tiny bf16 model: whenever a pass crosses certain lengths); a verify pass checks row by row, so at every
    length it gives exactly the single steps' logits, while a prompt is still read in one call."""
    model = _sharpen(_gemma2()).to(torch.bfloat16)
    ids = torch.randint(96, (140,), generator=torch.Generator().manual_seed(5))
    for length in (20, 90):
        runner = hf.HFRunner(model, 512)
        runner.forward(ids[:length])
        alone = torch.cat([runner.forward(ids[length + i : length + i + 1]) for i in range(17)])
        for m in (2, 9, 17):
            runner.truncate(length)
            assert torch.equal(runner.forward(ids[length : length + m], last=m), alone[:m]), (length, m)
            assert runner.length == length + m
    calls = []
    real = model.forward
    fresh = hf.HFRunner(model, 512)
    model.forward = lambda *a, **kw: calls.append(kw["input_ids"].shape[1]) or real(*a, **kw)
    try:
        fresh.forward(ids[:40])
        fresh.forward(ids[40:45], last=5)
    finally:
        del model.forward
    assert calls == [40, 1, 1, 1, 1, 1]


def test_a_sliding_window_model_steps_and_rolls_back_past_its_window():
    """Gemma 3's local layers see a window of 8 positions: steps and rollbacks far past it, through a cache that
    keeps every position, agree with transformers' reading of the whole text (fp32, to a tolerance: other
    kernels), where its sliding cache could not be cut back once full."""
    model = _gemma3(sliding_window=8).float()
    ids = torch.randint(96, (60,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = model(ids[None]).logits[0].float()  # transformers' own reading of the whole text, no cache
    runner = hf.HFRunner(model, 512)
    runner.forward(ids[:30])
    for start in range(30, 60, 5):
        runner.forward(ids[start : start + 5], last=5)
        runner.truncate(start + 2)  # rejected drafts
        got = runner.forward(ids[start + 2 : start + 5], last=3)
        assert torch.allclose(got, whole[start + 2 : start + 5], atol=1e-4, rtol=1e-4)


def test_the_load_says_which_path_a_family_takes_and_why():
    target = _loaded(_neox(), torch.float32)
    assert target.path.startswith("gpt_neox runs through transformers' forward (Specula's own forward does not "
                                  "compute a GELU MLP, rotary over part of each head yet)")
    assert "\n" not in target.path
    stablelm = _loaded(_stablelm(), torch.float32).path
    assert "does not compute rotary over part of each head" in stablelm
    assert _loaded(_gemma3(), torch.float32).path == ""  # Gemma 2 and 3 (text) run Specula's own forward
    assert _loaded(_gemma2(), torch.float32).path == ""
    from tests.support.tiny import loaded, tiny_model

    assert loaded(tiny_model()).path == ""
    assert loaded(tiny_model(), lean=False).path.startswith("llama runs through transformers' forward (asked for)")


@pytest.mark.parametrize("model_type,gaps", [
    ("llama", ()), ("qwen2", ()), ("qwen3", ()), ("mistral", ()), ("ministral", ()),
    ("mixtral", ("a mixture of experts (8 a layer)",)),
    ("qwen3_moe", ("a mixture of experts (128 a layer)",)),
    ("smollm3", ()),  # its layers without rotary: the lean forward skips rotary there
    ("phi3", ()),  # its fused weights, part of each head rotating (Phi-4-mini), longrope
    ("granite", ()),  # its multipliers
    ("olmo2", ()),  # its norms after attention and the MLP only, q/k norms over all heads
    ("gemma2", ()),  # Gemma 3's layers less q/k norms, soft-capped scores and logits
    ("gemma3_text", ()),  # its offset norms, four a layer, scaled embeddings, GELU-tanh, local and global layers
    ("gemma3", ("a vision tower",)),
    ("falcon", ("a layer shape it does not know",)),
])
def test_an_architecture_is_described_from_its_config_with_what_the_own_forward_lacks(model_type, gaps):
    from transformers import AutoConfig

    from specula.engine.models.families import spec_of

    assert spec_of(AutoConfig.for_model(model_type)).gaps == gaps
