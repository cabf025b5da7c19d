import os
import tempfile

# keep the tests' caches, settings and history away from the user's own
_tmp = tempfile.mkdtemp(prefix="specula-test-")
os.environ.setdefault("SPECULA_CONFIG_DIR", os.path.join(_tmp, "config"))
os.environ.setdefault("SPECULA_DATA_DIR", os.path.join(_tmp, "data"))
# offscreen Qt with a 1920x1200 screen (its default is 800x600, and a restored window is kept on screen)
with open(os.path.join(_tmp, "offscreen.json"), "w") as _screen:
    _screen.write('{"screens": [{"name": "test", "x": 0, "y": 0, "width": 1920, "height": 1200, '
                  '"logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}')
os.environ.setdefault("QT_QPA_PLATFORM", f"offscreen:configfile={os.path.join(_tmp, 'offscreen.json')}")
# one decoding step for the whole run (a background build finishing mid-test would change the bits
# between two answers a test compares); tests/engine/test_compiled.py asks for the compiled one
os.environ.setdefault("SPECULA_STEP", "eager")

import pytest  # noqa: E402

VLLM_FIXTURES = {"vllm_server", "vllm_servers"}
VLLM_SPECS = ["ngram"]  # the servers the vLLM tests share


def pytest_collection_modifyitems(config, items):
    """Tests on real vLLM servers run last, and vLLM's environment is set up in the background from the
    start of the run (minutes of package installs on a fresh machine, while the other tests run), then
    the server they share starts (about a minute), still while the other tests run."""
    late = [item for item in items if VLLM_FIXTURES & set(getattr(item, "fixturenames", ()))]
    if not late:
        return
    late.sort(key=lambda item: item.get_closest_marker("kills_server") is not None)  # its killer last
    items[:] = [item for item in items if item not in late] + late
    from pathlib import Path

    from tests.support.vllm_server import start_setup

    start_setup(Path(_tmp) / "vllm-setup.log", VLLM_SPECS)


@pytest.fixture(scope="session")
def bundled_fp32():
    """The bundled SmolLM2-135M-Instruct in fp32 on the CPU (converted once, then cached)."""
    from specula.engine.api.types import ModelChoice
    from specula.engine.models.loading import load_model

    return load_model(ModelChoice("bundled", device="cpu", dtype="fp32"))


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, bundled_fp32):
    """A local model folder: a tiny random Llama with the bundled tokenizer and a 128-token window."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=len(bundled_fp32.tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, eos_token_id=2,
    )
    import torch

    torch.manual_seed(0)  # the same weights every run: tests that look at what it drafts are repeatable
    LlamaForCausalLM(config).save_pretrained(folder)
    bundled_fp32.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def other_vocab_folder(tmp_path_factory, tiny_folder):
    """The same tiny model, but its tokenizer has extra tokens: not a valid draft for tiny_folder."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("other-vocab")
    for f in tiny_folder.iterdir():
        shutil.copy(f, folder / f.name)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_tokens(["<extra_one>", "<extra_two>"])
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory):
    """A real vLLM server with n-gram speculation serving the bundled model (see tests/support/vllm_server.py),
    in a list; the tests are skipped, with the reason, where it cannot be set up. (A plain server's metrics
    page is recorded in tests/engine/data: a second server doubled the time to start them.)"""
    from tests.support.vllm_server import Unavailable, start_servers

    try:
        servers = start_servers(VLLM_SPECS, tmp_path_factory.mktemp("vllm"))
    except Unavailable as exc:
        pytest.skip(f"no vLLM server: {exc}")
    yield servers
    for server in servers:
        server.kill()


@pytest.fixture(scope="session")
def vllm_server(vllm_servers):
    """The vLLM server with n-gram speculation."""
    return vllm_servers[0]
