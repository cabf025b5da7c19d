"""Draft heads as their projects publish them (engine/heads/published.py): small checkpoints written here in
exactly the published layouts (SafeAILab/EAGLE's EAGLE-1 `pytorch_model.bin` / `model.safetensors` with
config.json; EAGLE-3's `model.safetensors` with `d2t`/`t2d`, in SafeAILab's and SpecForge's layout and in the
speculators library's (vLLM's published heads) with each of its variants; FasterDecoding's `medusa_lm_head.pt`; vLLM's MedusaModel `model.safetensors`) on tiny random
targets. Each loads, drafts what its project's own formula gives (checked against transformers' Llama
layer as EAGLE's code uses it, and against the Medusa formula written out), and every strategy stays
greedy-identical to `none`. EAGLE-3 heads (SafeAILab's and SpecForge's layout) read the hidden states
entering three target layers, which the runner keeps for them. A head for another model or for layers the
model lacks, and a pickle that would run code, are refused with one line."""

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
from specula.engine.remote.hub import head_strategy
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


@pytest.mark.parametrize("kind", ["eagle1", "eagle3", "speculators-normed-output", "speculators-normed-residual",
                                  "speculators-qwen3"])
def test_published_eagle_heads_draft_in_bf16_through_the_compiled_library(tmp_path, ops, kind):
    """In bf16 with the compiled step's library loaded: an EAGLE-3 head's layer runs in one call of it (a
    speculators head's norms before fc and after the layer around it), an EAGLE-1 head (no norm before its
    attention), a head whose residual is the normed stream and a Qwen3 layer (norms over its queries and keys)
    keep the torch layer over 4-bit block products; all stay lossless."""
    import copy

    from specula.engine.heads.store import head_for_strategy
    from specula.engine.models.loading import LoadedModel

    model = tiny_model(vocab=VOCAB, layers=2 if kind == "eagle1" else 8, seed=21)
    low = LoadedModel(copy.deepcopy(model).to(torch.bfloat16), None, "tiny", torch.device("cpu"), torch.bfloat16)
    folder = tmp_path / kind
    if kind == "eagle3":
        _eagle3_files(folder, low, seed=11, draft_vocab=10)
    elif kind == "speculators-normed-output":
        _speculators_files(folder, low, seed=11, draft_vocab=10, aux_norm="each", normed_output=True)
    elif kind == "speculators-normed-residual":
        _speculators_files(folder, low, seed=11, draft_vocab=10, aux_norm="whole", normed_residual=True)
    elif kind == "speculators-qwen3":
        _speculators_files(folder, low, seed=11, draft_vocab=10, qk_norm=True)
    else:
        write_eagle1(folder, low, seed=4)
    head = head_for_strategy(low, str(folder), "eagle", "a head")
    assert (head.native is not None) == (kind in ("eagle3", "speculators-normed-output"))
    assert_greedy_identity(low, None, "eagle", {"head": str(folder)}, trials=8, longest_prompt=12, max_new_tokens=32)


def test_a_head_for_another_model_or_other_layers_is_refused(target, tmp_path):
    other = loaded(tiny_model(vocab=VOCAB + 8, layers=2, seed=3))
    write_eagle1(tmp_path / "eagle", other, embed=True)
    with pytest.raises(SpeculaError, match="made for a model of hidden size 64 and 24 tokens, not tiny") as failure:
        build_drafter("eagle", target, head=str(tmp_path / "eagle"))
    assert "\n" not in str(failure.value)
    e3 = tmp_path / "eagle3"
    _eagle3_files(e3, target, seed=1, draft_vocab=8)
    (e3 / "config.json").write_text(json.dumps({**json.loads((e3 / "config.json").read_text()),
                                                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}}))
    with pytest.raises(SpeculaError, match=r"reading layers \[1, 2, 6\] does not fit a model of 2 layers"):
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
    with pytest.raises(SpeculaError, match="unreadable") as refused:
        build_drafter("eagle", target, head=str(folder))
    assert "this ran" not in capsys.readouterr().out
    assert "could run code" in str(refused.value) and "weights_only=False" not in str(refused.value)  # never advised


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


@pytest.mark.parametrize("step", ["eager", "compiled"])
def test_the_runner_keeps_the_states_entering_the_layers_an_eagle3_head_reads(step, request):
    """runner.keep_layers: the hidden states entering those layers, for the prompt (eager), passes and
    single steps (compiled where built), as transformers' hidden_states give them."""
    if step == "compiled":
        request.getfixturevalue("ops")
    model = tiny_model(vocab=VOCAB, layers=8, seed=8)
    target = loaded(model)
    target.step = step
    runner = target.new_runner()
    layers = (2, 4, 5)
    runner.keep_layers(layers)
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(9))
    runner.forward(ids[:12])
    runner.forward(ids[12:20], last=8)
    for i in range(20, 30):
        runner.forward(ids[i : i + 1])
    assert runner.compiled == (step == "compiled")
    with torch.no_grad():
        states = model(ids[None], output_hidden_states=True).hidden_states
    want = torch.cat([states[i][0] for i in layers], dim=-1)
    assert torch.allclose(runner.aux_features(0, 30), want, atol=1e-4), (runner.aux_features(0, 30) - want).abs().max()


def _eagle3_files(folder, target, seed: int, draft_vocab: int, rope_scaling: dict | None = None):
    """An EAGLE-3 head as SafeAILab's cnets.py and SpecForge name its tensors (model.safetensors + config.json)."""
    gen = torch.Generator().manual_seed(seed)

    def w(*shape):
        return torch.randn(*shape, generator=gen) * 0.2

    state = {"fc.weight": w(HIDDEN, 3 * HIDDEN), "norm.weight": 1 + w(HIDDEN), "lm_head.weight": w(draft_vocab, HIDDEN)}
    for name, out in (("q", 64), ("k", 32), ("v", 32)):
        state[f"midlayer.self_attn.{name}_proj.weight"] = w(out, 2 * HIDDEN)
    state["midlayer.self_attn.o_proj.weight"] = w(HIDDEN, 64)
    for name, shape in (("gate", (INTER, HIDDEN)), ("up", (INTER, HIDDEN)), ("down", (HIDDEN, INTER))):
        state[f"midlayer.mlp.{name}_proj.weight"] = w(*shape)
    for name in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        state[f"midlayer.{name}.weight"] = 1 + w(HIDDEN)
    used = torch.randperm(VOCAB, generator=gen)[:draft_vocab].sort().values
    state["d2t"] = used - torch.arange(draft_vocab)
    state["t2d"] = torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, used, True)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    config = {**_eagle1_config(None), "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab,
              "head_dim": 16}
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    (folder / "config.json").write_text(json.dumps(config))
    return state


def eagle3_reference(state, target, aux, tokens, k, rope_scaling: dict | None = None, aux_norm=None,
                     normed_residual=False, normed_output=False, qk_norm=False):
    """EAGLE-3's draft chain written from its formula (cnets.py): fc over the three layers' states; the
    layer's attention reads [input_layernorm(embedding), hidden_norm(h)], residual h; the head's own norm
    and LM head; token = draft id + d2t; the output before the norm fed back. With the speculators library's
    flags (its eagle3 model): an RMS norm over the three states before fc, side by side ("whole") or each
    ("each"); the residual hidden_norm(h); the norm's output fed back; a Qwen3 layer's norms over each head's
    queries and keys before rotary."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         rope_theta=10000.0, max_position_embeddings=512, rope_scaling=rope_scaling)
    rotary = LlamaRotaryEmbedding(config)
    s = {k_: v.float() for k_, v in state.items()}

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    s = {k_.replace("layers.0.", "midlayer.", 1): v for k_, v in s.items()}  # the speculators library's names
    embed = target.model.get_input_embeddings()

    def before_fc(a):
        if aux_norm == "whole":
            return rms(a, s["input_norm.weight"])
        if aux_norm == "each":
            return torch.cat([rms(part, s[f"fc_norm.{j}.weight"]) for j, part in enumerate(a.chunk(3, -1))], -1)
        return a

    hs = [before_fc(aux[i]) @ s["fc.weight"].T for i in range(len(tokens))]
    embs = [embed(tokens[i : i + 1])[0] for i in range(len(tokens))]
    drafted = []
    with torch.no_grad():
        for _ in range(k):
            h = torch.stack(hs)
            x = torch.cat((rms(torch.stack(embs), s["midlayer.input_layernorm.weight"]),
                           rms(h, s["midlayer.hidden_norm.weight"])), -1)
            t = h.shape[0]
            q = (x @ s["midlayer.self_attn.q_proj.weight"].T).view(t, 4, 16).transpose(0, 1)[None]
            kk = (x @ s["midlayer.self_attn.k_proj.weight"].T).view(t, 2, 16).transpose(0, 1)[None]
            v = (x @ s["midlayer.self_attn.v_proj.weight"].T).view(t, 2, 16).transpose(0, 1)[None]
            if qk_norm:
                q, kk = rms(q, s["midlayer.self_attn.q_norm.weight"]), rms(kk, s["midlayer.self_attn.k_norm.weight"])
            cos, sin = rotary(x[None], torch.arange(t)[None])
            q, kk = apply_rotary_pos_emb(q, kk, cos, sin)
            att = F.scaled_dot_product_attention(q, kk, v, is_causal=True, enable_gqa=True)[0].transpose(0, 1).reshape(t, 64)
            residual = rms(h, s["midlayer.hidden_norm.weight"]) if normed_residual else h
            h2 = residual + att @ s["midlayer.self_attn.o_proj.weight"].T
            m = rms(h2, s["midlayer.post_attention_layernorm.weight"])
            out = h2 + (F.silu(m @ s["midlayer.mlp.gate_proj.weight"].T) * (m @ s["midlayer.mlp.up_proj.weight"].T)) \
                @ s["midlayer.mlp.down_proj.weight"].T
            last = out[-1]
            normed = rms(last, s["norm.weight"])
            draft_id = int((normed @ s["lm_head.weight"].T).argmax())
            if normed_output:
                last = normed
            token = draft_id + int(state["d2t"][draft_id])
            drafted.append(token)
            hs.append(last)
            embs.append(embed(torch.tensor([token]))[0])
    return drafted


def _eagle3_draft(model, target, head):
    """A 4-token chain the loaded EAGLE-3 head drafts after a prompt, with what its formula reads: the
    states entering layers 2, 4 and 5 of the 8-layer target (from transformers' own forward)."""
    prompt = [1, 5, 2, 7, 7, 3, 9, 4, 11, 6]
    drafter = Eagle(head, target, stop_below=0.0)
    runner = target.new_runner()
    runner.keep_layers(drafter.aux_layers)
    runner.forward(torch.tensor(prompt))
    ctx = DraftContext(torch.tensor(prompt + [3]), len(prompt), SamplingParams(), None, target=runner)
    draft = drafter.propose(ctx, 4)
    with torch.no_grad():
        states = model(torch.tensor(prompt)[None], output_hidden_states=True).hidden_states
    return draft, torch.cat([states[i][0] for i in (2, 4, 5)], dim=-1), ctx


def test_an_eagle3_checkpoint_drafts_what_its_formula_gives_and_stays_lossless(tmp_path):
    model = tiny_model(vocab=VOCAB, layers=8, seed=10)
    target = loaded(model)
    state = _eagle3_files(tmp_path / "eagle3", target, seed=11, draft_vocab=10)
    assert published_kind(tmp_path / "eagle3") == "eagle3"
    head, info = load_head(tmp_path / "eagle3", target, kind="eagle")
    assert head.aux_layers == (2, 4, 5) and info.kind == "eagle"
    draft, aux, ctx = _eagle3_draft(model, target, head)
    assert draft.tokens.tolist() == eagle3_reference(state, target, aux, ctx.tokens[1:], 4)
    assert set(draft.tokens.tolist()) <= set((torch.arange(10) + state["d2t"]).tolist())
    assert_greedy_identity(target, None, "eagle", {"head": str(tmp_path / "eagle3")}, trials=6, longest_prompt=12,
                           max_new_tokens=24)


def _speculators_files(folder, target, seed: int, draft_vocab: int, aux_norm=None, normed_residual=False,
                       normed_output=False, qk_norm=False, layers=1, extra=None):
    """An EAGLE-3 head as the speculators library saves it (its Eagle3 model; the layout of vLLM's published
    heads): `layers.0.*`, the target's embeddings, the norms its flags add (`input_norm` over the three states
    side by side, `fc_norm.{i}` over each), the layer's config nested in `transformer_layer_config` and the
    target layers named by the states entering them."""
    state = _eagle3_files(folder, target, seed, draft_vocab)
    state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
    state["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
    gen = torch.Generator().manual_seed(seed + 100)
    if aux_norm == "whole":
        state["input_norm.weight"] = 1 + 0.3 * torch.randn(3 * HIDDEN, generator=gen)
    elif aux_norm == "each":
        state.update({f"fc_norm.{j}.weight": 1 + 0.3 * torch.randn(HIDDEN, generator=gen) for j in range(3)})
    if qk_norm:  # the library's Qwen3 draft layer
        state.update({f"layers.0.self_attn.{n}_norm.weight": 1 + 0.3 * torch.randn(16, generator=gen) for n in "qk"})
    if layers > 1:
        state.update({k.replace("layers.0.", "layers.1.", 1): v.clone() for k, v in state.items() if k.startswith("layers.0.")})
    state.update(extra or {})
    save_file(state, str(folder / "model.safetensors"))
    layer = {"model_type": "qwen3" if qk_norm else "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
             "intermediate_size": INTER, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "num_hidden_layers": layers, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": VOCAB,
             "max_position_embeddings": 512, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
             "tie_word_embeddings": False}
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": draft_vocab,
              "norm_before_residual": normed_residual, "norm_before_fc": aux_norm == "whole", "fc_norm": aux_norm == "each",
              "norm_output": normed_output, "target_hidden_size": None, "eagle_aux_hidden_state_layer_ids": [2, 4, 5],
              "embed_requires_grad": False, "transformer_layer_config": layer,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": "tiny/target-8l", "architectures": ["LlamaForCausalLM"]}}}
    (folder / "config.json").write_text(json.dumps(config))
    return state


SPECULATORS_VARIANTS = {
    "plain": {},
    "norm before fc, normed residual": {"aux_norm": "whole", "normed_residual": True},
    "fc norms, normed output": {"aux_norm": "each", "normed_output": True},
    "a Qwen3 layer": {"qk_norm": True},
}


@pytest.mark.parametrize("variant", list(SPECULATORS_VARIANTS))
def test_a_speculators_eagle3_head_drafts_what_its_formula_gives_and_stays_lossless(tmp_path, variant):
    """The speculators library's layout, whose layer ids name the states entering the layers (2, 4, 5 here: as
    SpecForge's would read, 3, 5, 6, the drafts differ), with each of its variants."""
    flags = SPECULATORS_VARIANTS[variant]
    model = tiny_model(vocab=VOCAB, layers=8, seed=10)
    target = loaded(model)
    folder = tmp_path / "speculator"
    state = _speculators_files(folder, target, seed=15, draft_vocab=10, **flags)
    assert published_kind(folder) == "eagle3" and head_strategy(folder) == "eagle"
    head, info = load_head(folder, target, kind="eagle")
    assert head.aux_layers == (2, 4, 5) and info.target_name == "tiny/target-8l"
    draft, aux, ctx = _eagle3_draft(model, target, head)
    assert draft.tokens.tolist() == eagle3_reference(state, target, aux, ctx.tokens[1:], 4, **flags)
    if flags:  # the variant changes the drafts: the test tells the formulas apart
        assert draft.tokens.tolist() != eagle3_reference(state, target, aux, ctx.tokens[1:], 4)
        assert_greedy_identity(target, None, "eagle", {"head": str(folder)}, trials=6, longest_prompt=12,
                               max_new_tokens=24)


def test_a_speculators_head_of_several_layers_or_with_unnamed_norms_or_tensors_is_refused_in_one_line(tmp_path):
    target = loaded(tiny_model(vocab=VOCAB, layers=8, seed=10))
    _speculators_files(tmp_path / "two", target, seed=15, draft_vocab=10, layers=2)
    with pytest.raises(SpeculaError, match="has 2 decoder layers; this version runs EAGLE-3 heads of one") as caught:
        load_head(tmp_path / "two", target, kind="eagle")
    assert "\n" not in str(caught.value)
    folder = tmp_path / "unnamed"
    _speculators_files(folder, target, seed=15, draft_vocab=10, aux_norm="whole")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "norm_before_fc": False}))
    with pytest.raises(SpeculaError, match="has input_norm.weight, which its config.json does not say how to use"):
        load_head(folder, target, kind="eagle")
    (folder / "config.json").write_text(json.dumps({**config, "fc_norm": True}))
    with pytest.raises(SpeculaError, match="both norm_before_fc and fc_norm"):
        load_head(folder, target, kind="eagle")
    _speculators_files(tmp_path / "bias", target, seed=15, draft_vocab=10, extra={"layers.0.self_attn.q_proj.bias": torch.zeros(64)})
    with pytest.raises(SpeculaError, match="has layers.0.self_attn.q_proj.bias, which this version does not run"):
        load_head(tmp_path / "bias", target, kind="eagle")


# Llama 3.1's rotary scaling at a small size: with head_dim 16 the wavelengths (6 to 20,000 positions) fall
# on each side of and between the thresholds (original / high = 16, original / low = 64)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling", [LLAMA3, {"rope_type": "linear", "factor": 4.0}, {"type": "linear", "factor": 2.0}])
def test_a_heads_rotary_scaling_gives_transformers_frequencies(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from specula.engine.heads.config import HeadConfig

    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=4, head_dim=16, rope_theta=10000.0,
                         max_position_embeddings=512, rope_scaling=dict(scaling))
    want, _ = ROPE_INIT_FUNCTIONS[scaling.get("rope_type") or scaling["type"]](config, "cpu")
    got = HeadConfig(hidden=HIDDEN, heads=4, kv_heads=2, head_dim=16, intermediate=INTER, rope_theta=10000.0,
                     rope_scaling=scaling).inverse_frequencies()
    plain = HeadConfig(hidden=HIDDEN, heads=4, kv_heads=2, head_dim=16, intermediate=INTER).inverse_frequencies()
    assert torch.allclose(got, want.float(), rtol=1e-6) and not torch.allclose(got, plain)


def test_an_eagle3_checkpoint_with_llama3_rotary_scaling_drafts_what_its_formula_gives(tmp_path):
    """A head trained for Llama 3.1 carries its target's rope_scaling: drafting applies it (positions up to
    15 here, where the scaled and plain tables differ)."""
    model = tiny_model(vocab=VOCAB, layers=8, seed=10)
    target = loaded(model)
    state = _eagle3_files(tmp_path / "eagle3", target, seed=12, draft_vocab=10, rope_scaling=LLAMA3)
    head, _ = load_head(tmp_path / "eagle3", target, kind="eagle")
    assert head.config.rope_scaling == LLAMA3
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=HIDDEN, num_attention_heads=4, head_dim=16, rope_theta=10000.0,
                                              max_position_embeddings=512, rope_scaling=dict(LLAMA3)))
    positions = torch.arange(200)
    want_cos, want_sin = rotary(torch.zeros(1, 200, HIDDEN), positions[None])
    cos, sin = head._rope(positions, torch.float32)
    assert torch.allclose(cos, want_cos[0], atol=1e-5) and torch.allclose(sin, want_sin[0], atol=1e-5)
    draft, aux, ctx = _eagle3_draft(model, target, head)
    assert draft.tokens.tolist() == eagle3_reference(state, target, aux, ctx.tokens[1:], 4, rope_scaling=LLAMA3)


def test_a_head_with_rotary_scaling_it_cannot_apply_is_refused_in_one_line(tmp_path):
    target = loaded(tiny_model(vocab=VOCAB, layers=8, seed=10))
    _eagle3_files(tmp_path / "yarn", target, seed=13, draft_vocab=10, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(SpeculaError, match=r"rotary scaling 'yarn' is not supported for draft heads") as caught:
        load_head(tmp_path / "yarn", target, kind="eagle")
    assert "\n" not in str(caught.value)
    _eagle3_files(tmp_path / "partial", target, seed=13, draft_vocab=10, rope_scaling={"rope_type": "llama3", "factor": 8.0})
    with pytest.raises(SpeculaError, match="lacks low_freq_factor"):
        load_head(tmp_path / "partial", target, kind="eagle")


def test_a_heads_strategy_is_read_from_its_folder_without_loading_it(target, tmp_path):
    """The app's "Add draft head…" picks the strategy from the folder's files alone (torch-free)."""
    write_eagle1(tmp_path / "eagle1", target, seed=1)
    _eagle3_files(tmp_path / "eagle3", target, seed=1, draft_vocab=16)
    medusa = tmp_path / "medusa"
    medusa.mkdir()
    (medusa / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    (medusa / "medusa_lm_head.pt").write_bytes(b"")
    own = tmp_path / "own"
    own.mkdir()
    (own / "head.json").write_text(json.dumps({"kind": "medusa"}))
    assert [head_strategy(tmp_path / n) for n in ("eagle1", "eagle3", "medusa", "own")] == ["eagle", "eagle", "medusa", "medusa"]
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    model = tmp_path / "a-model"  # a model's own folder: its config.json and weights, 30 layers
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 30}))
    (model / "model.safetensors").write_bytes(b"")
    for name, why in (("empty", "holds no draft head"), ("broken", "unreadable"), ("missing", "is not a folder"),
                      ("a-model", r"holds a model \(30 layers\), not a draft head")):
        with pytest.raises(ValueError, match=why):
            head_strategy(tmp_path / name)


def test_published_heads_put_in_the_users_heads_folder_are_found_for_their_model(tmp_path, monkeypatch):
    """A head downloaded as published (config.json and weights) into the user's heads folder is found for the
    model it loads for, first among its kind; heads for models of other sizes are passed over without a word,
    and one that cannot be read is named."""
    from specula.engine.heads.store import find_heads
    from specula.engine.serving.session import Session

    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "data"))
    heads = tmp_path / "data" / "heads"
    t8 = loaded(tiny_model(vocab=VOCAB, layers=8, seed=10))
    _speculators_files(heads / "a-speculator", t8, seed=16, draft_vocab=10)
    _speculators_files(heads / "b-wider", t8, seed=16, draft_vocab=10)
    config = json.loads((heads / "b-wider" / "config.json").read_text())
    (heads / "b-wider" / "config.json").write_text(json.dumps({**config, "target_hidden_size": 2 * HIDDEN}))
    write_eagle1(heads / "c-other-vocab", loaded(tiny_model(vocab=VOCAB + 8, layers=2, seed=3)), embed=True)
    _eagle3_files(heads / "d-broken", t8, seed=17, draft_vocab=10)
    (heads / "d-broken" / "model.safetensors").write_bytes(b"not a safetensors file")
    (heads / "e-medusa").mkdir()
    torch.save({"0.0.linear.weight": torch.zeros(HIDDEN, HIDDEN), "0.0.linear.bias": torch.zeros(HIDDEN),
                "0.1.weight": t8.model.lm_head.weight.detach().clone()}, heads / "e-medusa" / "medusa_lm_head.pt")
    (heads / "e-medusa" / "config.json").write_text(json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1}))
    (heads / "f-not-a-head").mkdir()
    (heads / "f-not-a-head" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    skipped: list[str] = []
    found = find_heads(t8, skipped)
    assert found["eagle"][0] == heads / "a-speculator" and heads / "c-other-vocab" not in found["eagle"]
    assert heads / "b-wider" not in found["eagle"] and found["medusa"][0] == heads / "e-medusa"
    assert len(skipped) == 1 and "d-broken" in skipped[0] and "unreadable" in skipped[0], skipped
    session = Session()
    session.use(t8)
    assert session.heads["eagle"][0] == heads / "a-speculator" and session.head_warnings == skipped
    assert build_drafter("eagle", t8, head=str(session.heads["eagle"][0])).aux_layers == (2, 4, 5)


def test_finding_published_heads_reads_no_weights(tmp_path, monkeypatch):
    """Heads in the user's folder are checked against the model from their tensors' names and shapes (a
    safetensors header, a memory-mapped torch file), reading no weights: a large head is read once, when it is
    used."""
    import safetensors.torch

    from specula.engine.heads.store import find_heads

    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "data"))
    heads = tmp_path / "data" / "heads"
    t8 = loaded(tiny_model(vocab=VOCAB, layers=8, seed=10))
    _speculators_files(heads / "a-speculator", t8, seed=16, draft_vocab=10)
    write_eagle1(heads / "b-eagle1", t8, embed=True)
    write_eagle1(heads / "c-other-vocab", loaded(tiny_model(vocab=VOCAB + 8, layers=2, seed=3)), embed=True)
    (heads / "d-medusa").mkdir()
    torch.save({"0.0.linear.weight": torch.zeros(HIDDEN, HIDDEN), "0.0.linear.bias": torch.zeros(HIDDEN)},
               heads / "d-medusa" / "medusa_lm_head.pt")
    (heads / "d-medusa" / "config.json").write_text(json.dumps({"medusa_num_heads": 1, "medusa_num_layers": 1}))
    state = _speculators_files(heads / "e-map-past-the-vocabulary", t8, seed=16, draft_vocab=10)
    save_file({**state, "d2t": state["d2t"] + VOCAB}, str(heads / "e-map-past-the-vocabulary" / "model.safetensors"))
    reads = []
    load, load_file = torch.load, safetensors.torch.load_file

    def counted_load(path, *args, **kwargs):
        if not kwargs.get("mmap"):
            reads.append(path)
        return load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counted_load)
    monkeypatch.setattr(safetensors.torch, "load_file", lambda path, *a, **k: reads.append(path) or load_file(path, *a, **k))
    skipped: list[str] = []
    found = find_heads(t8, skipped)
    assert found["eagle"] == [heads / "a-speculator", heads / "b-eagle1"] and found["medusa"] == [heads / "d-medusa"]
    assert reads == [] and len(skipped) == 1 and "maps its vocabulary past" in skipped[0], skipped  # its map is read
    for folder in (heads / "a-speculator", heads / "b-eagle1"):
        load_head(folder, t8, kind="eagle")
    assert len(reads) == 2  # read when used


def _split(folder, state, bin_files=False):
    """The head's weights as a checkpoint in two files and an index naming them (its one file removed)."""
    keys = sorted(state)
    halves = {"model-00001-of-00002": keys[: len(keys) // 2], "model-00002-of-00002": keys[len(keys) // 2 :]}
    suffix = ".bin" if bin_files else ".safetensors"
    weight_map = {}
    for stem, part in halves.items():
        tensors = {k: state[k].clone() for k in part}
        if bin_files:
            torch.save(tensors, folder / (stem + suffix))
        else:
            save_file(tensors, str(folder / (stem + suffix)))
        weight_map.update(dict.fromkeys(part, stem + suffix))
    (folder / "model.safetensors").unlink()
    index = "pytorch_model.bin.index.json" if bin_files else "model.safetensors.index.json"
    (folder / index).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


@pytest.mark.parametrize("bin_files", [False, True])
def test_a_head_split_into_several_files_loads_as_one(tmp_path, bin_files):
    model = tiny_model(vocab=VOCAB, layers=8, seed=10)
    target = loaded(model)
    whole, split = tmp_path / "whole", tmp_path / "split"
    state = _speculators_files(whole, target, seed=18, draft_vocab=10, aux_norm="whole")
    _speculators_files(split, target, seed=18, draft_vocab=10, aux_norm="whole")
    _split(split, state, bin_files)
    assert published_kind(split) == "eagle3" and head_strategy(split) == "eagle"
    want = _eagle3_draft(model, target, load_head(whole, target, kind="eagle")[0])[0]
    assert _eagle3_draft(model, target, load_head(split, target, kind="eagle")[0])[0].tokens.tolist() == want.tokens.tolist()
    index = split / ("pytorch_model.bin.index.json" if bin_files else "model.safetensors.index.json")
    data = json.loads(index.read_text())
    data["weight_map"]["fc.weight"] = "../elsewhere.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(SpeculaError, match="names ../elsewhere.safetensors, which is not a file beside it"):
        load_head(split, target, kind="eagle")
    for text, why in (('{"weight_map": {}}', "names no files"), ("{not json", "is unreadable")):
        index.write_text(text)
        with pytest.raises(SpeculaError, match=f"the draft head's {index} {why}"):
            load_head(split, target, kind="eagle")


def test_a_split_head_downloads_with_every_file_its_index_names(tmp_path, monkeypatch):
    from pathlib import Path

    from specula.engine.remote.hub import download_head
    from tests.support.fake_hub import FakeHub

    target = loaded(tiny_model(vocab=VOCAB, layers=8, seed=10))
    folder = tmp_path / "made"
    state = _speculators_files(folder, target, seed=19, draft_vocab=10)
    _split(folder, state)
    repo = {p.name: p.read_bytes() for p in folder.iterdir()}
    repo["README.md"] = b"# a head\n"
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    broken = {n: data for n, data in repo.items() if n != "model-00002-of-00002.safetensors"}
    empty = repo | {"model.safetensors.index.json": b'{"weight_map": {}}'}
    with FakeHub({"someone/split-head": repo, "someone/broken-index": broken, "someone/empty-index": empty}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        got = Path(download_head("someone/split-head"))
        assert sorted(p.name for p in got.iterdir()) == sorted(n for n in repo if n != "README.md")
        assert load_head(got, target, kind="eagle")[0].aux_layers == (2, 4, 5)
        with pytest.raises(SpeculaError, match="names model-00002-of-00002.safetensors, which the repository does not hold"):
            download_head("someone/broken-index")
        with pytest.raises(SpeculaError, match="'someone/empty-index': model.safetensors.index.json names no files"):
            download_head("someone/empty-index")
