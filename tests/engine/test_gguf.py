"""A GGUF file loaded as it is: config, tokenizer and template from its metadata, its blocks run as the file
stores them, no full-precision copy of a weight at any moment, the same tokens through every strategy, and
one line for every way a file can be wrong. The files are written by the tests (tests/support/gguf_files.py)."""

from __future__ import annotations

import pytest
import torch

from specula.engine.api.errors import SpeculaError
from specula.engine.api.types import ModelChoice
from specula.engine.drafters import DRAFTERS
from specula.engine.models import from_gguf, gguf
from specula.engine.models.families import projections
from specula.engine.models.gguf import GGUFFile
from specula.engine.models.loading import load_model
from tests.support.gguf_files import damaged, data_offset, tiny_llama, write_gguf
from tests.support.tiny import assert_greedy_identity, head_options

# what llama.cpp's quantizer writes for Q4_K_M: Q4_K, with Q6_K for attn_v, ffn_down and the embedding
Q4_K_M = {"default": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "embed": "Q6_K", "output": "Q8_0"}
FORMATS = {name: {"default": name} for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")}
FORMATS["Q4_K_M"] = Q4_K_M
# types the products do not run (made dense from the file, one tensor at a time), beside ones they do
PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FORMATS["mixed dense"] = {"default": "Q4_0", "attn_q": "Q3_K", "ffn_up": "F16", "ffn_gate": "BF16", "embed": "Q2_K",
                          "ffn_down": "IQ4_NL"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    model = tiny_llama(tied=False)
    return {name: write_gguf(folder / f"{name.replace(' ', '-')}.gguf", model, types) for name, types in FORMATS.items()}


@pytest.fixture(scope="module")
def shared_file(tmp_path_factory):
    """shared_file(name, write) -> the file `write(path)` writes, written once for the module's tests that read it."""
    folder = tmp_path_factory.mktemp("shared")
    written = {}

    def get(name: str, write):
        if name not in written:
            written[name] = write(folder / name)
        return written[name]

    return get


@pytest.fixture(autouse=True)
def embedding_from_the_file(monkeypatch):
    """The tests' files are small: their embeddings would be copied (from_gguf.EMBED_COPY_BYTES); read them from the
    file, as a user's larger model's."""
    monkeypatch.setattr(from_gguf, "EMBED_COPY_BYTES", 0)


def _load(path, **kw):
    return load_model(ModelChoice(str(path), device="cpu", **{"dtype": "bf16", **kw}))


def _greedy(target, prompt: list[int], strategy: str = "none", n: int = 24) -> list[int]:
    from specula.engine.api.types import DecodeConfig
    from specula.engine.decoding.loop import generate
    from specula.engine.drafters import build_drafter

    drafter = build_drafter(strategy, target, None)
    return list(generate(target.new_runner(), drafter, prompt, DecodeConfig(k=4, max_new_tokens=n)))[-1].token_ids


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_runs_as_the_file_stores_it(files, name, monkeypatch):
    dequantized = []
    real = gguf.GGUFFile.dequantize
    monkeypatch.setattr(gguf.GGUFFile, "dequantize", lambda self, n, dtype, rows=None: (
        dequantized.append((n, rows is None)) or real(self, n, dtype, rows)))
    target = _load(files[name])
    roles = FORMATS[name]
    kinds = {roles.get(r, roles["default"]) for r in PROJECTIONS if r not in _dense_roles(name)} & set(gguf.NATIVE_TYPES)
    assert target.weights == f"{'/'.join(sorted(kinds))} (native)"
    whole = {n for n, whole in dequantized if whole}
    assert all("norm" in n or n.endswith(tuple(f"{t}.weight" for t in _dense_roles(name))) for n in whole), whole
    params = dict(target.model.named_parameters())
    for module, blocks in target.native.tensors.items():  # every projection the file's blocks run: no copy
        assert blocks.type_name in gguf.NATIVE_TYPES
        assert isinstance(target.model.lm_head, gguf.FileHead) if module == "lm_head" else params[f"{module}.weight"].is_meta
    # projections in types the products do not run are tiles alone (their groups' copies dropped): no module
    # keeps a weight of any projection
    assert all(p.is_meta for n, p in params.items() if n.endswith(tuple(f"{m}.weight" for m in projections())))
    # the embedding is looked up from the file, row by row, in its own format
    assert isinstance(target.model.get_input_embeddings(), gguf.FileEmbedding)
    with pytest.raises(SpeculaError, match="--weights dequantized"):  # transformers' forward would read nothing
        target.model(torch.tensor([[1, 2, 3]]))
    dense = _load(files[name], weights="dequantized")
    assert dense.native is None and not any(p.is_meta for p in dense.model.parameters())
    ids = torch.arange(100, 140)
    ours, theirs = target.new_runner().forward(ids, last=40), dense.new_runner().forward(ids, last=40)
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.75  # int8 activations against dense bf16
    prompt = list(range(300, 320))
    assert _greedy(target, prompt, "prompt-lookup") == _greedy(target, prompt)


def _dense_roles(name: str) -> tuple[str, ...]:
    """The GGUF names of the roles a format writes in types the products do not run."""
    roles = FORMATS[name]
    dense = {role for role, t in roles.items() if role != "default" and t not in gguf.NATIVE_TYPES}
    for group in (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up")):  # run as one product each
        if dense & set(group):
            dense |= set(group)
    return tuple(dense)


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("strategy", sorted(set(DRAFTERS) - {"none"}))
def test_greedy_speculation_over_a_gguf_as_it_is_is_identical_to_plain_decoding(files, strategy, tmp_path):
    target = _load(files["Q4_K_M"])
    options = head_options(target, strategy, tmp_path)
    assert_greedy_identity(target, target, strategy, options, trials=3, longest_prompt=90, max_new_tokens=40)


@pytest.mark.parametrize("name", ["Q4_K_M", "mixed dense"])
@pytest.mark.parametrize("strategy", ["prompt-lookup", "auto"])
def test_through_the_compiled_step_speculation_over_a_gguf_is_plain_decoding(files, name, strategy, tmp_path):
    """The compiled step over the file's blocks, and over the bf16 weights of its dense groups (tiles alone, whose
    prompts unpack them: no other copy), prompts long enough to be read in chunks."""
    from specula.engine.cpu import step

    step.prepare(wait=True)
    target = load_model(ModelChoice(str(files[name]), device="cpu", dtype="bf16", step="compiled"))
    runner = target.new_runner()
    runner.forward(torch.arange(5, 75))
    assert runner.compiled
    kinds = set(runner.fast.kinds)
    assert kinds == {"blocks"} if name == "Q4_K_M" else {"blocks", "tiles-unpack"} <= kinds
    assert_greedy_identity(target, None, strategy, {}, trials=3, longest_prompt=300, max_new_tokens=32)


@pytest.mark.usefixtures("one_torch_thread")
def test_the_dequantized_load_is_transformers_own_reading_of_the_file(tmp_path):
    """Config, weights (Llama's q/k rows put back by transformers' own processor) and tokenizer as
    transformers reads the file, without its fp32 copy of the whole model; the blocks, with the row order
    undone by an index, give the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = write_gguf(tmp_path / "m.gguf", tiny_llama(tied=True, seed=3), "Q8_0")
    ours = _load(path, dtype="fp32")
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    mine, theirs = ours.model.state_dict(), ref.state_dict()
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "vocab_size", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(ours.model.config, key) == getattr(ref.config, key), key
    assert ours.model.config.rope_parameters["rope_theta"] == ref.config.rope_parameters["rope_theta"]
    tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    chat = [{"role": "user", "content": "Hello there, how are you?"}]
    assert ours.tokenizer.get_vocab() == tok.get_vocab()
    assert ours.tokenizer.apply_chat_template(chat, add_generation_prompt=True) == tok.apply_chat_template(
        chat, add_generation_prompt=True)
    assert ours.eos_ids == {tok.eos_token_id}
    native = _load(path)
    dense = dict(ours.model.named_modules())
    for module, blocks in native.native.tensors.items():
        if module != "lm_head":
            assert torch.equal(blocks.dequantize(), dense[module].weight), module


def test_a_qwen2_file_with_biases_runs_natively_as_dequantized(tmp_path):
    path = write_gguf(tmp_path / "q.gguf", tiny_llama("qwen2", tied=True, seed=4, bias=True), "Q8_0")
    target, dense = _load(path), _load(path, weights="dequantized")
    assert target.model.config.model_type == "qwen2" and target.weights == "Q8_0 (native)"
    assert torch.count_nonzero(target.model.model.layers[0].self_attn.q_proj.bias) > 0
    ids = torch.arange(7, 47)
    ours, theirs = target.new_runner().forward(ids, last=40), dense.new_runner().forward(ids, last=40)
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.75
    assert (ours - theirs).abs().max() < 0.1 * theirs.abs().max()


def _reads_back(model, path, positions: int = 40):
    """`model` written as F32 at `path` and read in fp32: the lean forward's logits of `positions` tokens are the
    original model's. Returns the loaded model."""
    ours = _load(write_gguf(path, model, "F32"), dtype="fp32")
    ids = torch.randint(0, model.config.vocab_size, (positions,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids[None]).logits[0].float()
    got = ours.new_runner().forward(ids, last=positions)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    return ours


def _blocks_through_the_step(path, strategy: str = "prompt-lookup", longest_prompt: int = 60):
    """The file at `path` loaded natively: its blocks (and nothing else) run through the compiled step, and `strategy`'s
    greedy answers are plain decoding's. Returns the loaded model."""
    from specula.engine.cpu import step

    step.prepare(wait=True)
    target = load_model(ModelChoice(str(path), device="cpu", dtype="bf16", step="compiled"))
    runner = target.new_runner()
    runner.forward(torch.arange(5, 40))
    runner.forward(torch.tensor([7]))
    assert runner.compiled and set(runner.fast.kinds) == {"blocks"}
    assert_greedy_identity(target, None, strategy, {}, trials=3, longest_prompt=longest_prompt, max_new_tokens=32)
    return target


@pytest.mark.parametrize("strategy", ["prompt-lookup", "auto"])
def test_a_qwen3_file_runs_its_blocks_through_the_compiled_step(shared_file, strategy):
    """Qwen3's per-head norms read from the file (attn_q_norm, attn_k_norm) run in the compiled step with the file's
    blocks; speculation keeps plain decoding's answer."""
    path = shared_file("qwen3.gguf", lambda at: write_gguf(at, tiny_llama("qwen3", seed=4), "Q4_0"))
    target = _blocks_through_the_step(path, strategy)
    assert target.model.config.model_type == "qwen3" and target.weights == "Q4_0 (native)"
    assert not target.model.model.layers[0].self_attn.q_norm.weight.is_meta


def test_a_gemma3_file_is_read_as_llama_cpp_writes_it(tmp_path):
    """Gemma 3 as llama.cpp's converter lays it out (norms stored as 1 + w, four a layer, post_attention_norm and
    post_ffw_norm, the window in the metadata, five local layers to one global, the global layers' linear rotary scaling
    of 4B and larger): read in fp32 from F32 tensors, the lean forward gives the original model's logits past the window;
    its embedding is scaled, where it is read from the file too."""
    model = tiny_llama("gemma3", layers=6, seed=6, vocab=4096, tied=True, rope_scaling=8.0)  # Gemma 3 4B's rotary
    ours = _reads_back(model, tmp_path / "g.gguf", positions=48)
    cfg = ours.model.config
    assert cfg.model_type == "gemma3_text" and cfg.sliding_window == 16 and cfg.query_pre_attn_scalar == cfg.head_dim
    assert cfg.rope_parameters["full_attention"]["rope_type"] == "linear" and cfg.rope_parameters["full_attention"]["factor"] == 8
    assert cfg.rope_parameters["sliding_attention"]["rope_type"] == "default"
    assert cfg.layer_types == model.config.layer_types and cfg.layer_types.count("full_attention") == 1
    assert ours.uses_lean_forward and ours.path == ""
    ids = torch.randint(0, 4096, (48,), generator=torch.Generator().manual_seed(3))
    embedding = gguf.FileEmbedding(GGUFFile(tmp_path / "g.gguf"), "token_embd.weight", torch.float32, 4.0)
    assert torch.equal(embedding(ids), model.model.embed_tokens.weight[ids] * 4.0)


def test_a_gemma2_file_is_read_with_its_soft_capping_and_runs_its_blocks(tmp_path):
    """Gemma 2 as llama.cpp writes it (norms as 1 + w, the soft-capping values and the window in the metadata, local and
    global layers in turn): its fp32 logits from F32 tensors are the original model's past the window; in Q8_0 its
    blocks run through the compiled step and speculation keeps plain decoding's answer."""
    model = tiny_llama("gemma2", layers=4, seed=10, vocab=4096, tied=True)
    ours = _reads_back(model, tmp_path / "g.gguf")
    cfg = ours.model.config
    assert cfg.model_type == "gemma2" and ours.path == "" and cfg.sliding_window == 16
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping, cfg.query_pre_attn_scalar) == (5.0, 30.0, 64)
    _blocks_through_the_step(write_gguf(tmp_path / "q.gguf", model, "Q8_0"))


@pytest.mark.parametrize("strategy", ["prompt-lookup", "auto"])
def test_a_gemma3_file_runs_its_blocks_through_the_compiled_step(shared_file, strategy):
    path = shared_file("gemma3.gguf", lambda at: write_gguf(at, tiny_llama("gemma3", layers=6, seed=7),
                                                            {"default": "Q4_0", "embed": "Q8_0"}))
    target = _blocks_through_the_step(path, strategy)
    assert target.model.config.model_type == "gemma3_text" and target.weights.endswith("(native)")
    embed = target.model.model.embed_tokens  # looked up from the file, scaled by sqrt(hidden) as Gemma's is
    assert isinstance(embed, gguf.FileEmbedding) and embed.scalar_embed_scale == 16.0


def test_a_phi3_file_is_read_as_llama_cpp_writes_it_and_runs_its_fused_blocks(tmp_path):
    """Phi-3 as llama.cpp's converter lays it out (attn_qkv and ffn_up fused, the rotated dimensions, longrope's factors
    as tensors, the window): read in fp32 from F32 tensors it gives the original model's logits (within the factors'
    original window of 64, where transformers takes the short ones); in Q8_0 its fused blocks run through the compiled
    step and speculation keeps plain decoding's answer past that window."""
    model = tiny_llama("phi3", layers=2, seed=8, vocab=4096, tied=False)
    ours = _reads_back(model, tmp_path / "p.gguf", positions=60)
    rope = ours.model.config.rope_parameters
    assert ours.model.config.model_type == "phi3" and rope["rope_type"] == "longrope"
    assert rope["partial_rotary_factor"] == 0.75 and ours.model.config.sliding_window == 24 and ours.path == ""
    assert torch.allclose(torch.tensor(rope["long_factor"]), torch.tensor(model.config.rope_parameters["long_factor"]))
    _blocks_through_the_step(write_gguf(tmp_path / "q.gguf", model, "Q8_0"), longest_prompt=90)


def test_a_granite_file_is_read_with_its_multipliers_and_its_q_k_rows_put_back(tmp_path):
    """Granite as llama.cpp writes it (a Llama layout, q/k rows permuted, its four multipliers in the metadata, which
    transformers' table does not read): its config, its logits in fp32 from F32 tensors, and its blocks in Q8_0 through
    the compiled step, speculation keeping plain decoding's answer."""
    model = tiny_llama("granite", layers=2, seed=9, vocab=4096, tied=True)
    ours = _reads_back(model, tmp_path / "g.gguf")
    cfg = ours.model.config
    assert cfg.model_type == "granite" and ours.path == ""
    assert (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.logits_scaling) == (12.0, pytest.approx(0.22), 8.0)
    _blocks_through_the_step(write_gguf(tmp_path / "q.gguf", model, "Q8_0"))


def test_a_smollm3_file_is_read_with_its_layers_without_rotary(tmp_path):
    """SmolLM3 as llama.cpp writes it (a Llama layout, q/k rows permuted; every fourth layer without rotary, which the
    file does not say and both take as the family's): its fp32 logits from F32 tensors are the original model's."""
    model = tiny_llama("smollm3", layers=4, seed=13, vocab=4096, tied=True)
    ours = _reads_back(model, tmp_path / "s.gguf")
    assert ours.model.config.model_type == "smollm3" and ours.path == ""
    assert ours.model.config.no_rope_layers == model.config.no_rope_layers and 0 in model.config.no_rope_layers


def test_an_olmo2_file_is_read_and_runs_its_blocks(tmp_path):
    """OLMo 2 as llama.cpp writes it (its keys, which transformers' table does not read; post_attention_norm and
    post_ffw_norm, q/k norms over all heads): its fp32 logits from F32 tensors are the original model's; in Q8_0 its
    blocks run through the compiled step and speculation keeps plain decoding's answer."""
    model = tiny_llama("olmo2", layers=2, seed=12, vocab=4096, tied=False)
    ours = _reads_back(model, tmp_path / "o.gguf")
    assert ours.model.config.model_type == "olmo2" and ours.path == ""
    _blocks_through_the_step(write_gguf(tmp_path / "q.gguf", model, "Q8_0"))


def test_an_exaone4_file_is_read_and_runs_its_blocks(tmp_path):
    """EXAONE 4 as llama.cpp writes it (the Llama keys, its window and a flag a layer for where it applies, the
    output norms, per-head q/k norms): its fp32 logits are the original model's, its global layers without rotary;
    in Q8_0 its blocks run through the compiled step and speculation keeps plain decoding's answer."""
    model = tiny_llama("exaone4", layers=2, seed=13, vocab=4096, tied=False)
    ours = _reads_back(model, tmp_path / "e.gguf")
    assert ours.model.config.model_type == "exaone4" and ours.path == ""
    assert ours.model.config.layer_types == model.config.layer_types == ["sliding_attention", "full_attention"]
    _blocks_through_the_step(write_gguf(tmp_path / "q.gguf", model, "Q8_0"))


def test_llama_3_rotary_factors_in_the_file_scale_the_frequencies(tmp_path):
    model = tiny_llama(seed=5)
    half = model.config.head_dim // 2
    factors = torch.linspace(1.0, 8.0, half)
    plain = _load(write_gguf(tmp_path / "a.gguf", model, "Q8_0"))
    scaled = _load(write_gguf(tmp_path / "b.gguf", model, "Q8_0", extra={"rope_freqs.weight": factors.numpy()}))
    inv = plain.model.model.rotary_emb.inv_freq
    assert torch.allclose(scaled.model.model.rotary_emb.inv_freq, inv / factors)


def test_a_file_without_a_chat_template_loads_as_a_base_model(tmp_path):
    base = _load(write_gguf(tmp_path / "base.gguf", tiny_llama(seed=6), "Q4_0", chat_template=False))
    assert not base.tokenizer.chat_template
    assert len(_greedy(base, [5, 6, 7], n=5)) == 5


def test_a_gguf_under_another_name_is_known_by_its_magic_bytes(tmp_path):
    """As llama.cpp reads any file that starts with "GGUF": a model saved without the .gguf suffix loads and is
    described; a file that is not a GGUF says so, not that it is no file."""
    from specula.engine.remote import hub

    written = write_gguf(tmp_path / "m.gguf", tiny_llama(seed=6, layers=1), "Q8_0")
    unnamed = written.rename(tmp_path / "model-q8")
    assert len(_greedy(_load(unnamed), [5, 6, 7], n=4)) == 4
    assert hub.describe(str(unnamed)).architecture == "llama"
    (other := tmp_path / "notes.txt").write_text("not a model")
    for read in (_load, lambda p: hub.describe(str(p))):
        with pytest.raises(SpeculaError) as exc:
            read(other)
        _one_line(exc, "notes.txt", "is not a GGUF file")


# -- a file that is wrong, in one line each -----------------------------------------------------------------

def _one_line(exc: pytest.ExceptionInfo, *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_a_truncated_file_says_where_it_ends(files, tmp_path):
    data = files["Q4_0"].read_bytes()
    for cut in (10, 5000, len(data) // 2, len(data) - 7):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(SpeculaError) as exc:
            _load(path)
        _one_line(exc, path.name, "truncated", f"{cut} bytes")


def test_a_damaged_tensor_table_is_refused_naming_the_tensor_before_any_data_is_read(tmp_path, monkeypatch):
    """Offsets that are not multiples of the alignment, a tensor moved onto another or made larger than its place
    (a type with more bytes), one moved past the end, and a name listed twice are refused as llama.cpp refuses
    them, from the table alone; a full-length file is never called truncated."""
    good = write_gguf(tmp_path / "good.gguf", tiny_llama(seed=9), "Q8_0")
    q, k = "blk.0.attn_q.weight", "blk.0.attn_k.weight"
    at = data_offset(good, q)
    cases = {
        "misaligned": ({"offset": at + 1}, ("misaligned", q, str(at + 1), "alignment (32)")),
        "onto": ({"offset": data_offset(good, k)}, ("overlaps", q, k)),
        "f32": ({"type_id": 0}, ("overlaps", q, k)),  # F32: four bytes a weight where Q8_0 has about one
        "past": ({"offset": good.stat().st_size}, ("past the end of the file", q)),
        "twice": ({"name": k}, ("listed twice", k)),
    }
    monkeypatch.setattr(gguf.GGUFFile, "raw", lambda *a: pytest.fail("a tensor's bytes were read"))
    for case, (change, words) in cases.items():
        path = damaged(good, tmp_path / f"{case}.gguf", q, **change)
        with pytest.raises(SpeculaError) as exc:
            _load(path)
        _one_line(exc, f"{case}.gguf", *words)
        assert "truncated" not in str(exc.value)


def test_a_tensor_retyped_to_leave_a_gap_and_a_file_relabelled_another_architecture_are_refused(tmp_path, monkeypatch):
    """A tensor made a smaller type (its bytes no longer reach the next tensor, or the file's end) and a Qwen2 file
    labelled llama (its biases have no place) ran and answered "!!!!": refused in one line before a tensor is read."""
    from gguf import GGMLQuantizationType as T

    good = write_gguf(tmp_path / "good.gguf", tiny_llama(seed=9), "Q8_0")
    tensors = GGUFFile(good).tensors
    last = max(tensors.values(), key=lambda e: e.offset)
    assert last.type_name == "Q8_0"  # made Q4_0 (18 bytes a block of 32, not 34), it ends half way
    cases = {"gap": ("blk.0.attn_q.weight", ("bytes lie between tensor 'blk.0.attn_q.weight' (Q4_0",
                                             "blk.0.attn_k.weight", "damaged")),
             "end": (last.name, ("past its last tensor", last.name, "Q4_0", "damaged"))}
    monkeypatch.setattr(gguf.GGUFFile, "raw", lambda *a: pytest.fail("a tensor's bytes were read"))
    for case, (tensor, words) in cases.items():
        with pytest.raises(SpeculaError) as exc:
            _load(damaged(good, tmp_path / f"{case}.gguf", tensor, type_id=int(T.Q4_0)))
        _one_line(exc, f"{case}.gguf", *words)
        assert "truncated" not in str(exc.value)
    relabelled = write_gguf(tmp_path / "relabelled.gguf", tiny_llama("qwen2", seed=4, bias=True), "Q8_0", arch="llama")
    for weights in ("auto", "dequantized"):
        with pytest.raises(SpeculaError) as exc:
            _load(relabelled, weights=weights)
        _one_line(exc, "relabelled.gguf", "tensor blk.0.attn_q.bias", "no place in a 'llama' model")


def test_a_file_rewritten_at_its_own_size_says_so_not_that_its_size_changed(tmp_path):
    import os

    from specula.engine.api.errors import ModelFileChanged

    path = write_gguf(tmp_path / "m.gguf", tiny_llama(seed=9, layers=1), "Q8_0")
    file, size = GGUFFile(path), path.stat().st_size
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    with open(path, "r+b") as f:  # in place: the same file, other bytes
        f.write(bytes(data))
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(ModelFileChanged) as exc:
        file.raw("token_embd.weight")
    _one_line(exc, f"m.gguf changed on disk since it was loaded (rewritten, still {size} bytes): load it again")
    assert "now" not in str(exc.value)


def test_an_alignment_that_is_not_a_power_of_two_is_refused(tmp_path):
    from specula.engine.api.gguf_header import GGUFError, read_header

    key = b"general.alignment"
    path = tmp_path / "odd.gguf"
    for alignment in (0, 24):
        path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                         + len(key).to_bytes(8, "little") + key + (4).to_bytes(4, "little")
                         + alignment.to_bytes(4, "little"))
        with pytest.raises(GGUFError, match=f"general.alignment is {alignment}, not a power of two"):
            read_header(path)


def test_tensors_that_do_not_match_the_metadata_are_named(tmp_path):
    model = tiny_llama(seed=7)
    path = write_gguf(tmp_path / "m.gguf", model, "Q8_0")
    header = path.read_bytes()
    key = b"llama.feed_forward_length"
    at = header.index(key) + len(key) + 4  # past the key and its type: the value
    wrong = header[:at] + (384).to_bytes(4, "little") + header[at + 4:]
    bad = tmp_path / "wrong-shape.gguf"
    bad.write_bytes(wrong)
    for weights in ("auto", "dequantized"):
        with pytest.raises(SpeculaError) as exc:
            _load(bad, weights=weights)
        _one_line(exc, "blk.0.ffn", "384")


def test_a_missing_tensor_an_unknown_architecture_and_an_unknown_type_are_named(tmp_path):
    model = tiny_llama(seed=8)
    with pytest.raises(SpeculaError) as exc:
        _load(write_gguf(tmp_path / "missing.gguf", model, "Q8_0", drop=("blk.1.ffn_up.weight",)))
    _one_line(exc, "missing.gguf", "holds no tensor blk.1.ffn_up.weight for", "layers.1.mlp.up_proj")
    with pytest.raises(SpeculaError) as exc:
        _load(write_gguf(tmp_path / "arch.gguf", model, "Q8_0", arch="frobnicator"))
    _one_line(exc, "arch.gguf", "architecture 'frobnicator'", "llama")
    data = bytearray((path := write_gguf(tmp_path / "type.gguf", model, "Q8_0")).read_bytes())
    entry = gguf.GGUFFile(path).tensors["blk.0.attn_q.weight"]
    name = b"blk.0.attn_q.weight"
    at = data.index(name) + len(name) + 4 + 8 * len(entry.shape)  # past the name, n_dims and dims: the type
    data[at:at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(SpeculaError) as exc:
        _load(path)
    _one_line(exc, "blk.0.attn_q.weight", "99")


def test_an_architecture_transformers_reads_but_specula_cannot_run_is_refused_with_the_list_that_loads(tmp_path):
    """Mamba is in transformers' GGUF table (it has no attention heads, and its state is no KV cache): refused in
    one line, never an AttributeError; the list the line shows is the architectures a file loads with, each of
    which transformers can build as a causal LM from a file's metadata."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from specula.engine.api.errors import UnsupportedModelError

    for arch in ("mamba", "qwen3moe", "t5"):
        path = write_gguf(tmp_path / f"{arch}.gguf", tiny_llama(seed=8, layers=1), "Q8_0", arch=arch)
        with pytest.raises(UnsupportedModelError) as exc:
            _load(path)
        _one_line(exc, f"{arch}.gguf", f"architecture '{arch}' is not one Specula can run",
                  f"(it runs {', '.join(from_gguf.runnable_archs())})")
    runnable = set(from_gguf.runnable_archs())
    assert {"llama", "qwen2", "gemma3", "phi3", "stablelm"} <= runnable and not {"mamba", "t5", "qwen3moe"} & runnable
    for arch in from_gguf.TRANSFORMERS_ARCHS:
        assert arch in GGUF_CONFIG_MAPPING and arch in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, arch


def test_a_model_that_does_not_fit_in_memory_is_refused_before_loading(files, monkeypatch):
    monkeypatch.setattr(from_gguf, "available_memory", lambda: 300 << 20)  # as if 0.3 GB were free
    with pytest.raises(SpeculaError) as exc:
        _load(files["Q4_0"])
    _one_line(exc, "Q4_0.gguf", "needs about 1.0 GB", "0.3 GB is free")


def test_without_the_compiled_step_a_file_is_dequantized_and_says_why(files, monkeypatch):
    from specula.engine.cpu import step

    monkeypatch.setattr(step, "prepare", lambda wait: None)
    monkeypatch.setattr(step, "ops", lambda: None)
    monkeypatch.setattr(step, "error", lambda: "no C++ compiler found (set CXX, or install g++)")
    said = []
    model = load_model(ModelChoice(str(files["Q4_0"]), device="cpu", dtype="bf16"), progress=said.append)
    assert model.native is None and model.weights == "bf16"
    assert any("no C++ compiler" in line and "dequantized" in line for line in said)
    with pytest.raises(SpeculaError, match="cannot run Q4_0.gguf with native weights: the compiled step"):
        _load(files["Q4_0"], weights="native")


def test_old_converted_copies_are_removed_once_and_a_cache_that_cannot_be_written_costs_nothing(files, monkeypatch,
                                                                                               tmp_path):
    """An earlier version's fp32 copies are removed at the next load, with a line saying how much was freed; a
    cache folder that cannot be written (here a path under a file: refused even to root) neither stops a GGUF's
    load nor leaves anything behind, since loading one writes nothing there."""
    cache = tmp_path / "cache"
    old = cache / "gguf" / "abc123"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"\0" * 3_000_000)
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(cache))
    said = []
    load_model(ModelChoice(str(files["Q4_0"]), device="cpu", dtype="bf16"), progress=said.append)
    assert not (cache / "gguf").exists()
    assert [line for line in said if "earlier version" in line] == [
        "removed the converted copies of GGUF files an earlier version kept (0.0 GB freed)"]
    said.clear()
    load_model(ModelChoice(str(files["Q4_0"]), device="cpu", dtype="bf16"), progress=said.append)
    assert not any("earlier version" in line for line in said)  # once
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(blocked / "cache"))
    model = load_model(ModelChoice(str(files["Q4_0"]), device="cpu", dtype="bf16"))
    assert model.native is not None and blocked.is_file() and blocked.read_text() == ""
    prompt = list(range(300, 312))
    assert _greedy(model, prompt, n=8) == _greedy(_load(files["Q4_0"]), prompt, n=8)
