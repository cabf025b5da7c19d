import pytest
import torch

from specula.engine.api.errors import IncompatibleDraftError, ModelNotFoundError, SpeculaError
from specula.engine.api.types import ModelChoice
from specula.engine.models import loading
from specula.engine.models.loading import check_same_vocabulary, load_model, resolve_device, resolve_dtype


def test_local_folder_loads_with_the_lean_forward(tiny_folder):
    model = load_model(ModelChoice(str(tiny_folder), device="cpu", dtype="bf16"))
    assert model.dtype == torch.bfloat16 and next(model.model.parameters()).dtype == torch.bfloat16
    assert model.uses_lean_forward
    assert model.context_window == 128
    assert 2 in model.eos_ids


def test_lean_forward_matches_transformers_on_the_bundled_model(bundled_fp32):
    ids = torch.tensor(bundled_fp32.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3))
    with torch.no_grad():
        ref = bundled_fp32.model(ids[None]).logits[0].float()
    runner = bundled_fp32.new_runner()
    ours = torch.cat([runner.forward(ids[:10], last=10), runner.forward(ids[10:11]), runner.forward(ids[11:], last=len(ids) - 11)])
    assert torch.allclose(ours, ref, atol=2e-3, rtol=1e-3)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


@pytest.mark.parametrize("lean", [True, False])
def test_rollback_then_new_tokens_equals_a_fresh_pass(lean):
    from tests.support.tiny import loaded, tiny_model

    model = loaded(tiny_model(vocab=64, seed=4), lean=lean)
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(0))
    other = torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(1))
    runner = model.new_runner()
    runner.forward(ids[:30])
    runner.forward(ids[30:], last=10)  # 40 tokens cached
    runner.truncate(25)
    assert runner.length == 25
    rolled = runner.forward(other, last=10)
    fresh = model.new_runner()
    expected = fresh.forward(torch.cat([ids[:25], other]), last=10)
    assert torch.allclose(rolled, expected, atol=1e-5)


def test_cache_grows_past_its_first_allocation():
    from tests.support.tiny import loaded, tiny_model

    model = loaded(tiny_model(vocab=64, seed=4, max_pos=1024))
    ids = torch.randint(0, 64, (700,), generator=torch.Generator().manual_seed(2))
    runner = model.new_runner()
    chunks = [runner.forward(ids[i : i + 100], last=100) for i in range(0, 700, 100)]
    with torch.no_grad():
        ref = model.model(ids[None]).logits[0]
    assert torch.allclose(torch.cat(chunks), ref, atol=1e-4)


def test_missing_sources_are_clear_errors(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        load_model(ModelChoice(str(tmp_path / "model.gguf")))
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_model(ModelChoice(str(tmp_path)))
    with pytest.raises(ModelNotFoundError, match="not a file, a folder or a Hub id"):
        load_model(ModelChoice("./nothing/here"))


def test_device_and_dtype_resolution():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype("fp16", torch.device("cpu")) == torch.float16
    with pytest.raises(SpeculaError):
        resolve_device("tpu")
    with pytest.raises(SpeculaError):
        resolve_dtype("int3", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(SpeculaError, match="CUDA"):
            resolve_device("cuda")


def test_a_gguf_leaves_no_copy_in_the_cache_and_old_copies_go_once(tmp_path, monkeypatch):
    """A GGUF is read as it is: loading one writes nothing to the cache but the compiled step; the fp32 copies an
    earlier version kept there are removed at the next GGUF load, once, with a line saying how much was freed."""
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(tmp_path / "cache"))
    old = tmp_path / "cache" / "gguf" / "SmolLM2-0123"
    old.mkdir(parents=True)
    (old / "model.safetensors").write_bytes(b"w" * 3_000_000)
    said = []
    loading.load_model(ModelChoice("bundled", device="cpu", dtype="fp32"), progress=said.append)
    assert any("removed the converted copies" in line and "0.0 GB freed" in line for line in said)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) in ([], ["compiled"])
    said.clear()
    loading.load_model(ModelChoice("bundled", device="cpu", dtype="fp32"), progress=said.append)
    assert not any("removed" in line for line in said)


def test_vocabulary_check_names_the_difference(bundled_fp32, other_vocab_folder):
    from transformers import AutoTokenizer

    check_same_vocabulary(bundled_fp32.tokenizer, bundled_fp32.tokenizer)
    other = AutoTokenizer.from_pretrained(other_vocab_folder)
    with pytest.raises(IncompatibleDraftError, match="49152 tokens, draft has 49154.*2 only in the draft"):
        check_same_vocabulary(bundled_fp32.tokenizer, other)


def test_the_torch_free_option_names_match_the_loader():
    from specula.engine.api.paths import DEVICE_NAMES, DTYPE_NAMES, WEIGHT_NAMES

    assert DEVICE_NAMES == loading.DEVICES
    assert DTYPE_NAMES == ("auto", *loading.DTYPES)
    assert WEIGHT_NAMES == loading.WEIGHTS


def test_lean_forward_follows_a_model_converted_after_its_first_runner():
    import copy

    from tests.support.tiny import loaded, tiny_model

    model = tiny_model(vocab=64, seed=5)
    ids = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(0))
    first = loaded(model).new_runner().forward(ids, last=12)
    twin = copy.deepcopy(model).to(torch.bfloat16)  # the copy carries the fused weights of the original
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(1.5)
    runner = loaded(twin).new_runner()
    out = runner.forward(ids, last=12)
    assert out.dtype == torch.float32 and not torch.allclose(out, first, atol=1e-2)
    with torch.no_grad():
        ref = twin(ids[None]).logits[0].float()
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    assert torch.equal(loaded(model).new_runner().forward(ids, last=12), first)  # the original is untouched


def test_a_load_that_keeps_the_target_reads_only_the_draft(tiny_folder, tmp_path, monkeypatch):
    """The Models view's "Use as draft" (LoadRequest.keep_target): the target loaded now is kept where the load names
    the same one, with what was measured of it; only the draft is read (reading the 1.5B again took 23 s and 3.2 GB).
    A load that names another target, or does not keep it, reads it."""
    import shutil

    from specula.engine.api.events import BaselineCost
    from specula.engine.api.types import LoadRequest
    from specula.engine.serving import session as session_module
    from specula.engine.serving.session import Session

    draft = tmp_path / "draft"
    shutil.copytree(tiny_folder, draft)
    session = Session()
    spec = ModelChoice(str(tiny_folder), "cpu", "fp32")
    session.load(LoadRequest(spec, measure_baseline=False))
    target, baseline = session.target, BaselineCost(0.004, 1e-5)
    session.baseline = baseline
    read = []
    monkeypatch.setattr(session_module, "load_model", lambda s, say=None: read.append(s.source) or load_model(s, say))
    out = session.load(LoadRequest(spec, str(draft), measure_baseline=False, keep_target=True))
    assert read == [str(draft)] and session.target is target and session.baseline is baseline
    assert session.draft is not None and out.draft and "draft-model" in out.strategies
    session.load(LoadRequest(ModelChoice(str(tiny_folder), "cpu", "bf16"), str(draft), measure_baseline=False,
                             keep_target=True))  # another dtype: another target
    assert read[1:] == [str(tiny_folder), str(draft)] and session.target is not target
    session.load(LoadRequest(ModelChoice(str(tiny_folder), "cpu", "bf16"), measure_baseline=False))
    assert read[3:] == [str(tiny_folder)]  # not kept unless asked (a file changed in place is read again)
    # the window asks its engine process over HTTP: the wish goes with the load
    from specula.engine.remote.client import load_payload
    from specula.engine.serving.control import parse_load

    assert parse_load(load_payload(LoadRequest(spec, str(draft), keep_target=True))).keep_target is True
    assert parse_load(load_payload(LoadRequest(spec, str(draft)))).keep_target is False
