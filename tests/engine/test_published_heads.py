"""Draft heads as their projects publish them (engine/heads/published.py): small checkpoints written here in
exactly the published layouts (SafeAILab/EAGLE's EAGLE-1 `pytorch_model.bin` / `model.safetensors` with
config.json; FasterDecoding's `medusa_lm_head.pt`; vLLM's MedusaModel `model.safetensors`) on tiny random
targets. Each loads, drafts what its project's own formula gives (checked against transformers' Llama
layer as EAGLE's code uses it, and against the Medusa formula written out), and every strategy stays
greedy-identical to `none`. A head for another model, an EAGLE-3 head and a pickle that would run code are
refused with one line."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specula.engine.api.errors import SpeculaError
from specula.engine.api.types import SamplingParams
from specula.engine.decoding.drafter import DraftContext
from specula.engine.drafters import build_drafter
from specula.engine.drafters.eagle import Eagle
from specula.engine.drafters.medusa import Medusa
from specula.engine.heads.published import published_kind
from specula.engine.heads.store import load_head
from tests.support.tiny import assert_greedy_identity, loaded, tiny_model

VOCAB, HIDDEN, INTER = 16, 64, 96


@pytest.fixture(scope="module")
def target():
    return loaded(tiny_model(vocab=VOCAB, layers=2, seed=21))


def _eagle1_state(target, seed: int, fc_bias: bool, embed: bool) -> dict:
    """An EAGLE-1 checkpoint's tensors as SafeAILab's cnets1.py names them (4 heads of 16, 2 kv heads)."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.2

    state = {"fc.weight": w(HIDDEN, 2 * HIDDEN)}
    if fc_bias:
        state["fc.bias"] = w(HIDDEN)
    for name, out in (("q", 64), ("k", 32), ("v", 32)):
        state[f"layers.0.self_attn.{name}_proj.weight"] = w(out, HIDDEN)
    state["layers.0.self_attn.o_proj.weight"] = w(HIDDEN, 64)
    state["layers.0.mlp.gate_proj.weight"] = w(INTER, HIDDEN)
    state["layers.0.mlp.up_proj.weight"] = w(INTER, HIDDEN)
    state["layers.0.mlp.down_proj.weight"] = w(HIDDEN, INTER)
    state["layers.0.post_attention_layernorm.weight"] = 1 + w(HIDDEN)
    if embed:
        state["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    return state


def _eagle1_config(bias: bool | None) -> dict:
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": VOCAB,
              "max_position_embeddings": 512, "torch_dtype": "float32"}
    if bias is not None:
        config["bias"] = bias
    return config


def write_eagle1(folder, target, seed=0, fc_bias=True, embed=True, safetensors=False):
    folder.mkdir(parents=True, exist_ok=True)
    state = _eagle1_state(target, seed, fc_bias, embed)
    (folder / "config.json").write_text(json.dumps(_eagle1_config(None if fc_bias else False)))
    if safetensors:
        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, folder / "pytorch_model.bin")
    return state


def eagle1_reference(state, target, features, tokens, k):
    """EAGLE-1's draft chain as its code computes it: fc over [embedding, feature], transformers' Llama
    layer with its input norm removed (cnets1.py), the target's LM head on the output, fed back."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**{k_: v for k_, v in _eagle1_config(None).items() if k_ not in ("architectures",)})
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, 0).eval()
    layer.load_state_dict({k_.removeprefix("layers.0."): v for k_, v in state.items() if k_.startswith("layers.0.")},
                          strict=False)
    layer.input_layernorm = torch.nn.Identity()
    rotary = LlamaRotaryEmbedding(config)
    fc = torch.nn.Linear(2 * HIDDEN, HIDDEN, bias="fc.bias" in state)
    fc.load_state_dict({k_.removeprefix("fc."): v for k_, v in state.items() if k_.startswith("fc.")})
    embed = target.model.get_input_embeddings()
    lm_head = target.model.get_output_embeddings()
    inputs = [fc(torch.cat((embed(tokens[i : i + 1]), features[i : i + 1]), -1)) for i in range(len(tokens))]
    drafted = []
    with torch.no_grad():
        for _ in range(k):
            x = torch.cat(inputs)[None]
            t = x.shape[1]
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            cos_sin = rotary(x, torch.arange(t)[None])
            out = layer(x, attention_mask=mask, position_embeddings=cos_sin)
            out = out[0] if isinstance(out, tuple) else out
            last = out[0, -1:]
            token = int(lm_head(last).argmax(-1))
            drafted.append(token)
            inputs.append(fc(torch.cat((embed(torch.tensor([token])), last), -1)))
    return drafted


def _context(target, prompt):
    runner = target.new_runner()
    runner.forward(torch.tensor(prompt))
    tokens = torch.tensor(prompt + [3])
    return runner, DraftContext(tokens, len(prompt), SamplingParams(), None, target=runner)


@pytest.mark.parametrize("layout", ["bin-with-bias", "safetensors-without-bias"])
def test_an_eagle1_checkpoint_drafts_what_eagles_code_computes(target, tmp_path, layout):
    bin_file = layout.startswith("bin")
    state = write_eagle1(tmp_path / "eagle", target, seed=1, fc_bias=bin_file, embed=bin_file, safetensors=not bin_file)
    assert published_kind(tmp_path / "eagle") == "eagle"
    head, info = load_head(tmp_path / "eagle", target, kind="eagle")
    assert info.kind == "eagle"
    prompt = [1, 5, 2, 7, 7, 3, 9, 4, 11]
    runner, ctx = _context(target, prompt)
    draft = Eagle(head, target, stop_below=0.0).propose(ctx, 4)
    with torch.no_grad():
        norm = target.model.model.norm
        features = norm(runner.features(0, len(prompt)))
    want = eagle1_reference(state, target, features, ctx.tokens[1:], 4)
    assert draft.tokens.tolist() == want


def test_published_medusa_heads_give_their_formulas_logits(target, tmp_path):
    """FasterDecoding's medusa_lm_head.pt (its config's head count is wrong, as in the published files:
    the weights hold five) and vLLM's MedusaModel layout, without biases."""
    gen = torch.Generator().manual_seed(2)
    heads = 5
    state = {}
    for h in range(heads):
        state[f"{h}.0.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=gen) * 0.1
        state[f"{h}.0.linear.bias"] = torch.randn(HIDDEN, generator=gen) * 0.1
        state[f"{h}.1.weight"] = torch.randn(VOCAB, HIDDEN, generator=gen)
    fd = tmp_path / "medusa"
    fd.mkdir()
    (fd / "config.json").write_text(json.dumps({"base_model_name_or_path": "tiny", "medusa_num_heads": 2,
                                                "medusa_num_layers": 1, "transformers_version": "4.31.0"}))
    torch.save(state, fd / "medusa_lm_head.pt")
    vl = tmp_path / "vllm-medusa"
    vl.mkdir()
    (vl / "config.json").write_text(json.dumps({"architectures": ["MedusaModel"], "model_type": "medusa",
                                                "hidden_size": HIDDEN, "vocab_size": VOCAB, "num_heads": heads,
                                                "num_hidden_layers": 1, "truncated_vocab_size": None}))
    save_file({**{f"blocks.{h}.layers.0.weight": state[f"{h}.0.linear.weight"] for h in range(heads)},
               **{f"lm_heads.{h}.weight": state[f"{h}.1.weight"] for h in range(heads)}}, str(vl / "model.safetensors"))
    runner, ctx = _context(target, [2, 4, 6, 8, 10, 12])
    with torch.no_grad():
        x = target.model.model.norm(runner.features(len(ctx.tokens) - 2, len(ctx.tokens) - 1))
    for folder, bias in ((fd, True), (vl, False)):
        assert published_kind(folder) == "medusa"
        head, info = load_head(folder, target, kind="medusa")
        drafter = Medusa(head, target)
        got = drafter.logits(runner.features(len(ctx.tokens) - 2, len(ctx.tokens) - 1)[0])
        want = torch.stack([F.linear(x + F.silu(F.linear(x, state[f"{h}.0.linear.weight"],
                                                         state[f"{h}.0.linear.bias"] if bias else None)),
                                     state[f"{h}.1.weight"])[0] for h in range(heads)])
        assert got.shape == (heads, VOCAB) and torch.allclose(got, want, atol=1e-5), folder.name
        assert info.config.medusa_heads == heads
        assert drafter.propose(ctx, 3).tokens.tolist() == want[:3].argmax(-1).tolist()


@pytest.mark.parametrize("strategy", ["eagle", "medusa"])
def test_every_published_head_keeps_greedy_identity(target, tmp_path, strategy):
    folder = tmp_path / strategy
    if strategy == "eagle":
        write_eagle1(folder, target, seed=4)
    else:
        folder.mkdir()
        gen = torch.Generator().manual_seed(5)
        state = {k: v for h in range(3) for k, v in ((f"{h}.0.linear.weight", torch.randn(HIDDEN, HIDDEN, generator=gen) * 0.1),
                                                     (f"{h}.0.linear.bias", torch.zeros(HIDDEN)),
                                                     (f"{h}.1.weight", target.model.lm_head.weight.detach().clone()))}
        (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
        torch.save(state, folder / "medusa_lm_head.pt")
    assert_greedy_identity(target, None, strategy, {"head": str(folder)}, trials=6, longest_prompt=12,
                           max_new_tokens=24)


def test_a_head_for_another_model_and_an_eagle3_head_are_refused(target, tmp_path):
    other = loaded(tiny_model(vocab=VOCAB + 8, layers=2, seed=3))
    write_eagle1(tmp_path / "eagle", other, embed=True)
    with pytest.raises(SpeculaError, match="made for a model of hidden size 64 and 24 tokens, not tiny") as failure:
        build_drafter("eagle", target, head=str(tmp_path / "eagle"))
    assert "\n" not in str(failure.value)
    e3 = tmp_path / "eagle3"
    e3.mkdir()
    (e3 / "config.json").write_text(json.dumps({**_eagle1_config(None), "architectures": ["LlamaForCausalLMEagle3"],
                                                "draft_vocab_size": 8}))
    save_file({"fc.weight": torch.zeros(HIDDEN, 3 * HIDDEN), "d2t": torch.zeros(8, dtype=torch.long)},
              str(e3 / "model.safetensors"))
    with pytest.raises(SpeculaError, match="EAGLE-3"):
        build_drafter("eagle", target, head=str(e3))
    with pytest.raises(SpeculaError, match="not the eagle head"):
        write_eagle1(tmp_path / "m", target)
        (tmp_path / "m" / "pytorch_model.bin").unlink()
        torch.save({"0.0.linear.weight": torch.zeros(HIDDEN, HIDDEN)}, tmp_path / "m" / "medusa_lm_head.pt")
        (tmp_path / "m" / "config.json").write_text(json.dumps({"medusa_num_heads": 1}))
        build_drafter("eagle", target, head=str(tmp_path / "m"))


class Planted:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_bin_that_would_run_code_is_refused(target, tmp_path, capsys):
    folder = tmp_path / "eagle"
    write_eagle1(folder, target)
    torch.save({"fc.weight": Planted()}, folder / "pytorch_model.bin")
    with pytest.raises(SpeculaError, match="unreadable"):
        build_drafter("eagle", target, head=str(folder))
    assert "this ran" not in capsys.readouterr().out


def test_a_session_takes_a_published_head_from_a_folder_or_the_hub(target, tmp_path, monkeypatch):
    """LoadRequest.draft_head (the CLI's --draft-head): a folder or a Hub id; the head comes first among
    its kind and answers with it stay the target's own."""
    import io

    from specula.engine.serving.session import Session
    from tests.support.fake_hub import FakeHub

    folder = tmp_path / "eagle"
    write_eagle1(folder, target, seed=6)
    medusa = io.BytesIO()
    torch.save({"0.0.linear.weight": torch.zeros(HIDDEN, HIDDEN), "0.0.linear.bias": torch.zeros(HIDDEN),
                "0.1.weight": target.model.lm_head.weight.detach().clone()}, medusa)
    repos = {"someone/medusa-tiny": {"config.json": json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1}).encode(),
                                     "medusa_lm_head.pt": medusa.getvalue(), "README.md": b"# heads\n"}}
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    session = Session()
    session.use(target)
    assert session.add_head(str(folder)) == "eagle" and session.heads["eagle"][0] == folder
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        assert session.add_head("someone/medusa-tiny") == "medusa"
    downloaded = session.heads["medusa"][0]
    assert (downloaded / "medusa_lm_head.pt").is_file() and not (downloaded / "README.md").exists()
    with pytest.raises(SpeculaError, match="neither a folder nor a Hub id"):
        session.add_head(str(tmp_path / "missing" / "x" / "y"))
