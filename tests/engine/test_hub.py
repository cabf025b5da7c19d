"""engine/hub.py against a local fake Hub: resumable downloads with progress and cancel, the cache listing,
model descriptions, vocabulary fingerprints and removal. Nothing here reaches the network."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from specula.engine.api.errors import ModelNotFoundError, SpeculaError
from specula.engine.remote import hub
from tests.support.fake_hub import FakeHub

REPO = "tiny-org/tiny-llama"
GGUF_REPO = "tiny-org/tiny-llama-GGUF"
WEIGHTS = "model.safetensors"


def _gguf_bytes(tmp_path, file_type: int) -> bytes:
    import gguf
    import numpy as np

    path = tmp_path / f"t{file_type}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(256)
    writer.add_file_type(file_type)
    writer.add_token_list(["<s>", "</s>", "a", "b", "ab"])
    writer.add_tensor("token_embd.weight", np.zeros((5, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """The served repositories: a tiny random Llama saved with save_pretrained (plus a README a snapshot skips),
    and a GGUF repository with two quantizations."""
    from tests.support.tiny import tiny_model

    folder = tmp_path_factory.mktemp("served")
    tiny_model(vocab=64, layers=4, max_pos=512).save_pretrained(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert len(files[WEIGHTS]) > 512 * 1024  # enough 64 KB chunks to cancel and drop part-way
    files["README.md"] = b"# tiny\n"
    files["chat_template.jinja"] = b"{% for m in messages %}{{ m['content'] }}{% endfor %}"  # where templates live now
    ggufs = {"tiny-Q4_1.gguf": _gguf_bytes(folder, 3), "tiny-Q8_0.gguf": _gguf_bytes(folder, 7)}
    return {REPO: files, GGUF_REPO: ggufs}


@pytest.fixture
def fake(repos, tmp_path, monkeypatch):
    """A fake Hub as HF_ENDPOINT, with an empty Hugging Face cache under tmp_path."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    with FakeHub(repos) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def _expected(repos) -> dict[str, bytes]:
    return {k: v for k, v in repos[REPO].items() if k != "README.md"}


def test_download_reports_progress_and_fills_the_cache(fake, repos):
    from huggingface_hub import snapshot_download
    from transformers import AutoConfig

    seen = []
    folder = hub.download(REPO, on_progress=lambda done, total: seen.append((done, total)))
    total = sum(len(v) for v in _expected(repos).values())
    assert seen[-1] == (total, total) and {t for _, t in seen} == {total}
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    assert len(seen) > total // (256 * 1024)
    files = {p.name: p.read_bytes() for p in Path(folder).iterdir()}
    assert files == _expected(repos)  # README.md is not part of a model snapshot
    assert AutoConfig.from_pretrained(folder).max_position_embeddings == 512
    # huggingface_hub (and so engine/loading.py) finds the snapshot offline
    assert snapshot_download(REPO, cache_dir=hub.hub_cache(), local_files_only=True) == folder
    assert hub.download(REPO) == folder  # a second download fetches nothing
    assert len([r for r in fake.requests if r[0] == "GET" and "/resolve/" in r[1]]) == len(files)


def test_a_cancelled_download_resumes_with_a_range_request(fake, repos):
    from transformers import AutoConfig

    def cancel_after_half() -> bool:
        return bool(seen) and seen[-1] > len(repos[REPO][WEIGHTS]) // 2

    seen = []
    with pytest.raises(hub.Cancelled):
        hub.download(REPO, on_progress=lambda done, total: seen.append(done), should_stop=cancel_after_half)
    partial = list(hub.hub_cache().rglob("*.incomplete"))
    kept = partial[0].stat().st_size if len(partial) == 1 else 0
    assert len(repos[REPO][WEIGHTS]) // 2 < kept < len(repos[REPO][WEIGHTS])
    assert hub.list_models() == [hub.describe("bundled")]  # an unfinished snapshot is not listed
    assert fake.ranges(WEIGHTS) == []

    folder = hub.download(REPO)
    assert fake.ranges(WEIGHTS) == [kept]  # resumed where the cancel left it
    assert (Path(folder) / WEIGHTS).read_bytes() == repos[REPO][WEIGHTS]
    assert AutoConfig.from_pretrained(folder).architectures == ["LlamaForCausalLM"]
    assert not list(hub.hub_cache().rglob("*.incomplete"))


def test_a_dropped_connection_is_resumed(fake, repos):
    fake.drop_once(WEIGHTS)
    path = hub.download(REPO, WEIGHTS)
    assert Path(path).read_bytes() == repos[REPO][WEIGHTS]
    (start,) = fake.ranges(WEIGHTS)  # one retry, from what reached the disk (the server sent half)
    assert 0 < start <= len(repos[REPO][WEIGHTS]) // 2


def test_list_describe_and_remove_a_cached_repo(fake, repos, tmp_path):
    folder = hub.download(REPO)
    missing = str(tmp_path / "gone")
    models = hub.list_models([missing, folder, "bundled"])
    assert [m.where for m in models] == ["bundled", "local"]  # the snapshot given as a folder is not listed twice
    Path(folder, "config.json").unlink()  # a local folder that became unreadable is skipped
    models = hub.list_models([folder])
    assert [m.where for m in models] == ["bundled"]
    folder = hub.download(REPO)

    entry = hub.list_models()[1]
    size = sum(len(v) for v in _expected(repos).values())
    assert (entry.source, entry.where, entry.path, entry.size_bytes) == (REPO, "cache", folder, size)
    assert (entry.architecture, entry.context_length, entry.quantization) == ("LlamaForCausalLM", 512, "fp32")
    assert entry.vocab_key == "" and entry.heads == ()  # no tokenizer in this repo
    assert hub.describe(REPO) == entry

    with pytest.raises(SpeculaError, match="not in the Hugging Face cache"):
        hub.remove_from_cache(models[0])
    assert hub.remove_from_cache(entry) == size
    assert hub.list_models() == [hub.describe("bundled")]
    with pytest.raises(ModelNotFoundError, match="not in the local Hugging Face cache"):
        hub.describe(REPO)


def test_gguf_repo_files_download_and_removal(fake, repos):
    sizes = {k: len(v) for k, v in repos[GGUF_REPO].items()}
    assert hub.gguf_files(GGUF_REPO) == sorted(sizes.items())
    paths = [hub.download(GGUF_REPO, name) for name in sorted(sizes)]
    entries = hub.list_models()[1:]
    assert [(e.source, e.where, e.size_bytes) for e in entries] == [(p, "cache", sizes[Path(p).name]) for p in paths]
    assert [(e.architecture, e.context_length, e.quantization) for e in entries] == [("llama", 256, "Q4_1"),
                                                                                    ("llama", 256, "Q8_0")]
    assert entries[0].vocab_key and entries[0].vocab_key == entries[1].vocab_key
    assert hub.remove_from_cache(entries[0]) == sizes["tiny-Q4_1.gguf"]  # one quantization of several
    assert [e.source for e in hub.list_models()[1:]] == [paths[1]]
    assert hub.remove_from_cache(hub.list_models()[1]) >= sizes["tiny-Q8_0.gguf"]
    assert hub.list_models()[1:] == []


def test_unreachable_or_unknown_repos_give_one_line_errors(fake, monkeypatch):
    with pytest.raises(SpeculaError, match="'tiny-org/nothing' is not on the Hub") as info:
        hub.download("tiny-org/nothing")
    assert "\n" not in str(info.value)
    with pytest.raises(SpeculaError, match="has no file 'absent.gguf'"):
        hub.download(GGUF_REPO, "absent.gguf")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    for call in (lambda: hub.download(REPO), lambda: hub.gguf_files(GGUF_REPO)):
        with pytest.raises(SpeculaError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message and dead in message and "tiny-org/" in message


@pytest.fixture(scope="module")
def tokenizer_folders(tmp_path_factory):
    """Two folders with the bundled model's tokenizer (converted from its GGUF), and one with extra tokens."""
    from transformers import AutoTokenizer

    gguf = hub.bundled_gguf_path()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    folders = []
    for name in ("same-a", "same-b", "extra"):
        folder = tmp_path_factory.mktemp(name)
        if name == "extra":
            tok.add_tokens(["<extra_one>", "<extra_two>"])
        tok.save_pretrained(folder)
        (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "dtype": "bfloat16",
                                                        "max_position_embeddings": 128}))
        folders.append(folder)
    return folders


def test_describe_bundled_and_vocab_keys(tokenizer_folders):
    bundled = hub.describe("bundled")
    assert (bundled.source, bundled.where, bundled.architecture, bundled.quantization) == (
        "bundled", "bundled", "llama", "Q4_1")
    assert bundled.context_length > 0 and bundled.size_bytes == hub.bundled_gguf_path().stat().st_size
    a, b, extra = (hub.describe(str(f)) for f in tokenizer_folders)
    assert (a.where, a.quantization, a.context_length) == ("local", "bf16", 128)
    assert a.vocab_key and a.vocab_key == b.vocab_key == bundled.vocab_key  # a GGUF and its tokenizer.json agree
    assert extra.vocab_key and extra.vocab_key != a.vocab_key


def test_describe_rejects_what_it_cannot_read(tmp_path):
    with pytest.raises(ModelNotFoundError, match="model file not found"):
        hub.describe(str(tmp_path / "none.gguf"))
    (tmp_path / "folder.gguf").mkdir()
    with pytest.raises(SpeculaError, match="is a folder, not a GGUF file"):
        hub.describe(str(tmp_path / "folder.gguf"))
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(SpeculaError, match="cannot read GGUF file"):
        hub.describe(str(tmp_path / "bad.gguf"))
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        hub.describe(str(tmp_path))
    (deep := tmp_path / "deep").mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError in Python's reader
    with pytest.raises(SpeculaError, match="config.json: it nests too deeply"):
        hub.describe(str(deep))


def test_recommended_models_name_their_drafts():
    ids = {r.repo_id for r in hub.RECOMMENDED}
    assert "HuggingFaceTB/SmolLM2-360M-Instruct" in ids and any(r.repo_id.endswith("-GGUF") for r in hub.RECOMMENDED)
    assert all(r.size_text and r.draft_repo_id != r.repo_id for r in hub.RECOMMENDED)
    assert any("gated" in r.note for r in hub.RECOMMENDED)


def test_network_failures_are_said_in_words_without_errno():
    from specula.engine.remote.hub import network_reason

    assert "offline" in network_reason(OSError("[Errno -3] Temporary failure in name resolution"))
    assert "offline" in network_reason(ConnectionError("HTTPSConnectionPool: Max retries exceeded (Caused by "
                                                       "NameResolutionError: [Errno -2] Name or service not known)"))
    assert network_reason(TimeoutError("read timed out")) == "it did not answer in time"
    assert network_reason(OSError("[Errno 28] something else")) == "something else"


def test_an_added_folder_is_named_by_its_repository_and_its_model_type(tmp_path):
    import json

    from specula.engine.remote.hub import describe

    snapshot = tmp_path / "hub" / "models--org--tiny-model" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 256}))
    entry = describe(str(snapshot))
    assert entry.name == "org/tiny-model" and entry.architecture == "llama" and entry.context_length == 256
    plain = tmp_path / "my-model"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert describe(str(plain)).name == "my-model" and describe(str(plain)).architecture == "LlamaForCausalLM"


def test_the_hub_is_searched_by_name_most_downloaded_first_with_sizes_and_quantizations(fake, repos):
    fake.downloads = {REPO: 10, GGUF_REPO: 500}
    fake.tags = {GGUF_REPO: ["gguf", "text-generation"]}
    found = hub.search_hub("tiny")
    assert [m.repo_id for m in found] == [GGUF_REPO, REPO] and found[0].downloads == 500
    assert found[0].gguf and not found[1].gguf
    assert [m.repo_id for m in hub.search_hub("tiny", gguf_only=True)] == [GGUF_REPO]
    assert hub.search_hub("no such model") == []
    details = hub.hub_details(GGUF_REPO)
    assert [q for q, _ in details.quantizations] == ["Q4_1", "Q8_0"] and details.files == 2
    assert details.size_bytes == sum(len(b) for b in repos[GGUF_REPO].values())
    plain = hub.hub_details(REPO)
    assert plain.quantizations == () and plain.size_bytes == len(repos[REPO][WEIGHTS])


def test_a_hub_search_without_a_network_says_so_in_one_line(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("HF_ENDPOINT", dead)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    from huggingface_hub import HfApi

    # at once: huggingface_hub's own listing retries a refused connection five times over 23 s
    monkeypatch.setattr(HfApi, "list_models", lambda *a, **k: pytest.fail("asked huggingface_hub, which retries"))
    with pytest.raises(SpeculaError, match="cannot search the Hub at .*refused the connection") as error:
        hub.search_hub("tiny")
    assert "\n" not in str(error.value) and "Errno" not in str(error.value)
