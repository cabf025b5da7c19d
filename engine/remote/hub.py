"""Models on this machine and on the Hugging Face Hub, without torch: what the app lists, describes,
downloads (resumably, with progress and cancel) and removes.

Downloads go through huggingface_hub into its cache, laid out as it lays it out, so it and transformers find them.
A cancelled or broken download keeps its bytes in `blobs/<etag>.incomplete` and the next one resumes them with a
Range request. HF_ENDPOINT, HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE are read on every call, not once at import.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from ..api.errors import ModelNotFoundError, SpeculaError, first_line
from ..api.gguf_header import read_header
from ..api.paths import BUNDLED_NAME, HUB_FILES, HUB_ID, bundled_gguf_path, local_source
from ..api.types import BUNDLED

_CHUNK = 64 * 1024  # progress and should_stop() come at least this often
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class ModelEntry:
    """One model the app can load, with what is known about it without loading it."""

    source: str  # what the app loads: "bundled", a folder path, a .gguf file path, or a Hub id "org/name"
    name: str
    where: str  # "bundled" | "local" | "cache"
    path: str  # folder or file on disk ("" if unknown)
    size_bytes: int
    architecture: str  # "LlamaForCausalLM", or a GGUF's general.architecture; "" unknown
    context_length: int  # 0 unknown
    quantization: str  # "bf16"/"fp16"/"fp32", a GGUF file type such as "Q4_1", a method such as "gptq"; "" unknown
    vocab_key: str  # fingerprint of the vocabulary: equal and non-empty means one can draft for the other
    heads: tuple[str, ...] = ()  # kinds of trained draft heads found for it (filled in by the app)


@dataclass(frozen=True)
class Recommended:
    """A chat model worth downloading, with the smaller model that drafts for it ("" if none)."""

    repo_id: str
    size_text: str
    draft_repo_id: str = ""
    note: str = ""


RECOMMENDED: tuple[Recommended, ...] = (
    Recommended("HuggingFaceTB/SmolLM2-360M-Instruct", "0.7 GB", "HuggingFaceTB/SmolLM2-135M-Instruct",
                "small and quick; the 135M model drafts for it"),
    Recommended("HuggingFaceTB/SmolLM2-1.7B-Instruct", "3.4 GB", "HuggingFaceTB/SmolLM2-135M-Instruct",
                "the best SmolLM2; the 135M model drafts for it"),
    Recommended("Qwen/Qwen2.5-1.5B-Instruct", "3.1 GB", "Qwen/Qwen2.5-0.5B-Instruct",
                "strong for its size; the 0.5B model drafts for it"),
    Recommended("Qwen/Qwen2.5-0.5B-Instruct", "1.0 GB", "", "a good draft for the larger Qwen2.5 models"),
    Recommended("meta-llama/Llama-3.2-3B-Instruct", "6.4 GB", "meta-llama/Llama-3.2-1B-Instruct",
                "gated: accept the licence on the Hub and log in with `hf auth login` first"),
    Recommended("bartowski/SmolLM2-1.7B-Instruct-GGUF", "1.0 GB (Q4_K_M)", "",
                "GGUF quantizations: choose one file (Q4_0/Q4_1/Q4_K run natively on the CPU)"),
)


class Cancelled(SpeculaError):
    """A download stopped by the user; what it fetched so far is kept and the next download resumes it."""


# -- where things are ------------------------------------------------------------------------------------


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, from the environment as it is now."""
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(os.path.expanduser(explicit)))
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                              "huggingface")
    return Path(os.path.expandvars(os.path.expanduser(home))) / "hub"


def hub_endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def describe(source: str) -> ModelEntry:
    """What `source` is ("bundled", a folder, a .gguf file, or a Hub id in the local cache), without loading it."""
    source = source.strip()
    if source == BUNDLED:
        return _describe_gguf(bundled_gguf_path(), BUNDLED, BUNDLED_NAME, "bundled")
    kind, path = local_source(source)
    if kind == "gguf":
        return _describe_gguf(path, str(path), path.name, "local")
    if kind == "folder":
        return _describe_folder(path, str(path), _folder_name(path), "local")
    for entry in _cache_entries(source):
        return entry
    raise ModelNotFoundError(f"model '{source}' is not in the local Hugging Face cache: download it first")


def list_models(extra_sources: Iterable[str] = ()) -> list[ModelEntry]:
    """The bundled model, then each of `extra_sources` still readable, then the models in the Hugging Face cache."""
    entries: list[ModelEntry] = []
    seen: set[str] = set()

    def add(entry: ModelEntry) -> None:
        keys = {f"source:{entry.source}"} | ({f"path:{os.path.realpath(entry.path)}"} if entry.path else set())
        if not keys & seen:
            seen.update(keys)
            entries.append(entry)

    for source in (BUNDLED, *extra_sources):
        try:
            add(describe(source))
        except (SpeculaError, OSError):
            continue
    for entry in _cache_entries():
        add(entry)
    return entries


def remove_from_cache(entry: ModelEntry) -> int:
    """Delete a cached model from the Hugging Face cache; the bytes freed. One .gguf of a repository holding
    several is removed alone, anything else takes the repository's revisions with it."""
    if entry.where != "cache":
        raise SpeculaError(f"'{entry.name}' is not in the Hugging Face cache: only downloaded models can be removed")
    info = _scan_cache()
    # the snapshot's entry itself, not the blob its link points at
    target = os.path.join(os.path.realpath(os.path.dirname(entry.path)), os.path.basename(entry.path))
    for repo in info.repos if info else ():
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            snapshot = os.path.realpath(revision.snapshot_path)
            if repo.repo_id == entry.source or (target and (target + os.sep).startswith(snapshot + os.sep)):
                if entry.path.lower().endswith(".gguf") and len(_gguf_names(repo)) > 1:
                    return _remove_gguf(repo, Path(entry.path).name)
                strategy = info.delete_revisions(*(r.commit_hash for r in repo.revisions))
                freed = int(strategy.expected_freed_size)
                try:
                    strategy.execute()
                except OSError as exc:
                    raise SpeculaError(f"cannot remove {repo.repo_id} from the cache: {first_line(exc)}") from None
                if repo.repo_path.exists():
                    shutil.rmtree(repo.repo_path, ignore_errors=True)  # unfinished downloads
                return freed
    raise SpeculaError(f"'{entry.name}' is no longer in the Hugging Face cache at {hub_cache()}")


def _gguf_names(repo) -> set[str]:
    return {f.file_name for r in repo.revisions for f in r.files if f.file_name.lower().endswith(".gguf")}


def _remove_gguf(repo, name: str) -> int:
    """Remove one .gguf (its snapshot links and, when nothing else uses it, its blob); the bytes freed."""
    blobs = {f.blob_path for r in repo.revisions for f in r.files if f.file_name == name}
    for r in repo.revisions:
        for f in r.files:
            if f.file_name == name:
                f.file_path.unlink(missing_ok=True)
    kept = {f.blob_path for r in repo.revisions for f in r.files if f.file_name != name}
    freed = 0
    for blob in blobs - kept:
        if blob.exists():
            freed += blob.stat().st_size
            blob.unlink()
    return freed


def _scan_cache():
    """huggingface_hub's scan of the cache, or None where there is no cache folder yet."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(hub_cache())
    except CacheNotFound:
        return None
    except (OSError, ValueError) as exc:
        raise SpeculaError(f"cannot read the Hugging Face cache at {hub_cache()}: {first_line(exc)}") from None


def _cache_entries(repo_id: str | None = None) -> list[ModelEntry]:
    """The loadable models in the cache (all of them, or one repository's), sorted by name."""
    info = _scan_cache()
    entries = []
    repos = sorted((r for r in info.repos if r.repo_type == "model") if info else (), key=lambda r: r.repo_id.lower())
    for repo in repos:
        if repo_id is not None and repo.repo_id != repo_id:
            continue
        revision = _current_revision(repo)
        if revision is None:
            continue
        folder = Path(revision.snapshot_path)
        try:
            if (folder / "config.json").is_file():
                entry = _describe_folder(folder, repo.repo_id, repo.repo_id, "cache")
                entries.append(replace(entry, size_bytes=int(repo.size_on_disk)))
                continue
            for gguf, size in _gguf_models(folder):
                entry = _describe_gguf(gguf, str(gguf), f"{repo.repo_id}/{gguf.name}", "cache")
                entries.append(replace(entry, size_bytes=size))
        except (SpeculaError, OSError):
            continue
    return entries


def _current_revision(repo):
    """The revision refs/main points at, else the newest one; None for a repository with no files yet."""
    revisions = [r for r in repo.revisions if r.files]
    main = [r for r in revisions if "main" in r.refs]
    return (main or sorted(revisions, key=lambda r: r.last_modified, reverse=True) or [None])[0]


def _gguf_models(folder: Path) -> list[tuple[Path, int]]:
    """The .gguf models in a snapshot: one per file, split files as their first part with the parts' total size."""
    found = []
    for file in sorted(p for p in folder.rglob("*") if p.name.lower().endswith(".gguf") and p.is_file()):
        split = _SPLIT.search(file.name)
        if split and int(split.group(1)) != 1:
            continue
        if split:
            pattern = file.name[: split.start()] + "-*-of-" + split.group(2) + ".gguf"
            size = sum(p.stat().st_size for p in file.parent.glob(pattern))
        else:
            size = file.stat().st_size
        found.append((file, size))
    return found


def _folder_name(folder: Path) -> str:
    """A folder's name as a list shows it: a Hugging Face cache snapshot (models--org--name/snapshots/HASH)
    by its repository, org/name; any other folder by its own name."""
    parent, top = folder.resolve().parent, folder.resolve().parent.parent
    if parent.name == "snapshots" and top.name.startswith("models--"):
        return top.name[len("models--"):].replace("--", "/")
    return folder.name


def _describe_folder(folder: Path, source: str, name: str, where: str) -> ModelEntry:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelNotFoundError(f"folder {folder} has no config.json: not a transformers model folder") from None
    except (OSError, ValueError) as exc:
        raise SpeculaError(f"cannot read {folder / 'config.json'}: {first_line(exc)}") from None
    except RecursionError:
        raise SpeculaError(f"cannot read {folder / 'config.json'}: it nests too deeply (the file is damaged)") from None
    if not isinstance(config, dict):
        raise SpeculaError(f"cannot read {folder / 'config.json'}: it is not a JSON object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    # a config saved without its architectures (some exports) still names its model type
    architectures = config.get("architectures") or [str(config.get("model_type") or text.get("model_type") or "")]
    context = 0
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = config.get(key, text.get(key))
        if isinstance(value, int) and value > 0:
            context = value
            break
    return ModelEntry(
        source=source, name=name, where=where, path=str(folder), size_bytes=_folder_size(folder),
        architecture=str(architectures[0]) if isinstance(architectures, list) else "", context_length=context,
        quantization=_config_quantization(config), vocab_key=_cached_vocab_key(folder),
    )


def _config_quantization(config: dict) -> str:
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and quant.get("quant_method"):
        bits = quant.get("bits")
        return f"{quant['quant_method']}" + (f" {bits}-bit" if isinstance(bits, int) else "")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "").replace("torch.", "")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "half": "fp16", "float": "fp32"}.get(dtype, "")


def _folder_size(folder: Path) -> int:
    total = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            if not name.endswith(".incomplete"):
                try:
                    total += os.stat(os.path.join(root, name)).st_size
                except OSError:
                    pass
    return total


# -- vocabulary fingerprints -----------------------------------------------------------------------------

_VOCAB_KEYS: dict[tuple, str] = {}


def _vocab_digest(pairs: Iterable[tuple[str, int]]) -> str:
    """sha256 of the sorted (token, id) pairs: equal exactly when two vocabularies map the same tokens to the same
    ids, whether they come from a tokenizer.json, a vocab.json or a GGUF."""
    items = sorted(set(pairs))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()


def _cached_vocab_key(folder: Path) -> str:
    for name in ("tokenizer.json", "vocab.json"):
        file = folder / name
        if file.is_file():
            added = folder / "added_tokens.json"
            stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in (file, added) if f.is_file())
            if stamp not in _VOCAB_KEYS:
                _VOCAB_KEYS[stamp] = _folder_vocab_key(file, added)
            return _VOCAB_KEYS[stamp]
    return ""


def _folder_vocab_key(file: Path, added: Path) -> str:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        pairs: list[tuple[str, int]] = []
        if file.name == "tokenizer.json":
            vocab = (data.get("model") or {}).get("vocab")
            if isinstance(vocab, dict):
                pairs += [(str(t), int(i)) for t, i in vocab.items()]
            elif isinstance(vocab, list):  # Unigram: [piece, score] in id order
                pairs += [(str(item[0]), i) for i, item in enumerate(vocab)]
            pairs += [(str(t["content"]), int(t["id"])) for t in data.get("added_tokens") or ()]
        else:
            pairs += [(str(t), int(i)) for t, i in data.items()]
            if added.is_file():
                pairs += [(str(t), int(i)) for t, i in json.loads(added.read_text(encoding="utf-8")).items()]
    except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError):
        return ""
    return _vocab_digest(pairs) if pairs else ""


# -- GGUF metadata ---------------------------------------------------------------------------------------


def _describe_gguf(path: Path, source: str, name: str, where: str) -> ModelEntry:
    stat = path.stat()
    stamp = ("gguf", str(path), stat.st_mtime_ns, stat.st_size)
    try:
        meta = read_header(path, lambda key: key.startswith("general.") or key.endswith(".context_length")
                           or key == "tokenizer.ggml.tokens", tensors=False).metadata
    except (ValueError, OSError) as exc:
        raise SpeculaError(f"cannot read GGUF file {path}: {first_line(exc)}") from None
    arch = str(meta.get("general.architecture", ""))
    context = meta.get(f"{arch}.context_length", 0)
    file_type = meta.get("general.file_type")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    if stamp not in _VOCAB_KEYS:
        _VOCAB_KEYS[stamp] = _vocab_digest((str(t), i) for i, t in enumerate(tokens)) if tokens else ""
    return ModelEntry(
        source=source, name=name, where=where, path=str(path), size_bytes=stat.st_size, architecture=arch,
        context_length=int(context) if isinstance(context, int) else 0,
        quantization=_file_type_name(file_type),
        vocab_key=_VOCAB_KEYS[stamp],
    )


def _file_type_name(file_type) -> str:
    """A GGUF's general.file_type by its llama.cpp name ("Q4_1", "Q4_K_M", "F16"); "" for an unknown one."""
    from gguf import LlamaFileType

    try:
        return LlamaFileType(file_type).name.split("_", 1)[1] if isinstance(file_type, int) else ""
    except (ValueError, IndexError):  # a type newer than the gguf package, or GUESSED
        return ""


# -- the Hub ---------------------------------------------------------------------------------------------
# What huggingface_hub lacks: hf_hub_download deletes a stopped download's partial file, so a cancel starts it over;
# each file's bytes go through its http_get into a kept blobs/<etag>.incomplete, then hf_hub_download places the blob.


def _repo_info(repo_id: str):
    """The repository's model info with file sizes and blob ids, or a one-line SpeculaError naming it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if not HUB_ID.match(repo_id):
        raise SpeculaError(f"'{repo_id}' is not a Hub id: expected org/name")
    _online(f"reach the Hub for '{repo_id}'")
    endpoint = hub_endpoint()
    try:
        return HfApi(endpoint=endpoint).model_info(repo_id, files_metadata=True, timeout=20)
    except GatedRepoError:
        raise SpeculaError(_gated(repo_id)) from None
    except RepositoryNotFoundError:
        raise SpeculaError(f"'{repo_id}' is not on the Hub at {endpoint} (or it is private: log in with "
                           "`hf auth login`)") from None
    except Exception as exc:  # the HTTP client's and huggingface_hub's errors, of several types
        raise SpeculaError(f"cannot reach the Hub at {endpoint} for '{repo_id}': {network_reason(exc)}") from None


_NETWORK_WORDS = (
    (("name or service not known", "temporary failure in name resolution", "nodename nor servname",
      "no address associated", "getaddrinfo failed"), "its address cannot be looked up (is this machine offline?)"),
    (("network is unreachable", "no route to host"), "no network reaches it (is this machine offline?)"),
    (("connection refused",), "it refused the connection"),
    (("timed out", "timeout"), "it did not answer in time"),
    (("certificate verify failed", "ssl"), "its secure connection could not be checked (a proxy or the clock?)"),
)


def network_reason(exc: Exception) -> str:
    """Why a connection failed, in words: the usual network failures named, else the error's first line
    without the "[Errno N]" of the system call."""
    text = first_line(exc)
    low = text.lower()
    for needles, words in _NETWORK_WORDS:
        if any(n in low for n in needles):
            return words
    return re.sub(r"\[Errno -?\d+\]\s*", "", text) or type(exc).__name__


def _online(what: str) -> None:
    """A one-line error, "cannot <what>: HF_HUB_OFFLINE is set", where the user asked for no Hub at all."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise SpeculaError(f"cannot {what}: HF_HUB_OFFLINE is set")


def _reachable(endpoint: str, timeout: float = 10.0) -> None:
    """Connect once to the endpoint's host (no request): a machine without a network, or a Hub address
    that refuses, fails here at once with the socket's error."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    socket.create_connection((url.hostname or "", port), timeout=timeout).close()


def _gated(repo_id: str) -> str:
    return f"'{repo_id}' is gated: accept its licence on the Hub, then log in with `hf auth login`"


@dataclass(frozen=True)
class HubModel:
    """A model the Hub lists for a search."""

    repo_id: str
    downloads: int
    likes: int
    gguf: bool  # its files are GGUF (tagged so, or its library is gguf)
    library: str


def search_hub(text: str, gguf_only: bool = False, limit: int = 30) -> list[HubModel]:
    """Text-generation models on the Hub whose name holds `text`, most downloaded first (at most `limit`)."""
    from huggingface_hub import HfApi

    _online("search the Hub")
    endpoint = hub_endpoint()
    try:
        _reachable(endpoint)  # huggingface_hub retries a refused connection for 23 s before it gives up
        found = HfApi(endpoint=endpoint).list_models(
            search=text.strip() or None, pipeline_tag="text-generation", filter="gguf" if gguf_only else None,
            sort="downloads", limit=limit, expand=["downloads", "likes", "tags", "library_name"])
        out = []
        for m in found:
            tags = list(m.tags or ())
            library = str(getattr(m, "library_name", "") or "")
            out.append(HubModel(m.id, int(m.downloads or 0), int(m.likes or 0), "gguf" in tags or library == "gguf",
                                library))
        return out
    except Exception as exc:  # the HTTP client's and huggingface_hub's errors, of several types
        raise SpeculaError(f"cannot search the Hub at {endpoint}: {network_reason(exc)}") from None


_QUANT = re.compile(r"(?i)(?:^|[-_.])(I?Q\d(?:_[A-Z0-9]+)*|BF16|F16|FP16|F32)(?=[-_.]|$)")


@dataclass(frozen=True)
class HubDetails:
    """What a listed model's files come to: their size, and for GGUF files their quantizations."""

    size_bytes: int
    files: int
    quantizations: tuple[tuple[str, int], ...]  # (quantization, the size of its file(s)), smallest first


def hub_details(repo_id: str) -> HubDetails:
    """The size of a repository's model files and its GGUF quantizations (one Hub request)."""
    siblings = _repo_info(repo_id).siblings or ()
    ggufs = [(s.rfilename, int(s.size or 0)) for s in siblings if s.rfilename.lower().endswith(".gguf")]
    quants: dict[str, int] = {}
    for name, size in ggufs:
        stem = name.rsplit("/", 1)[-1][: -len(".gguf")]
        match = _QUANT.findall(stem)
        kind = match[-1].upper() if match else stem
        quants[kind] = quants.get(kind, 0) + size
    model_files = ggufs or [(s.rfilename, int(s.size or 0)) for s in siblings
                            if s.rfilename.endswith((".safetensors", ".bin"))]
    return HubDetails(sum(size for _, size in model_files), len(model_files),
                      tuple(sorted(quants.items(), key=lambda item: item[1])))


def gguf_files(repo_id: str) -> list[tuple[str, int]]:
    """The (filename, size) of each .gguf file in a Hub repository, by name."""
    info = _repo_info(repo_id)
    return sorted((s.rfilename, int(s.size or 0)) for s in info.siblings or () if s.rfilename.lower().endswith(".gguf"))


def _files_to_fetch(repo_id: str, siblings: list, filename: str | None) -> list:
    """The repository files a download fetches: `filename` alone, or the files the app loads with config.json last
    (a snapshot with a config is a complete one: list_models shows only those)."""
    if filename is not None:
        chosen = [s for s in siblings if s.rfilename == filename]
        if not chosen:
            raise SpeculaError(f"'{repo_id}' has no file '{filename}'")
        return chosen
    patterns = HUB_FILES
    if not any(s.rfilename.endswith(".safetensors") for s in siblings):
        patterns = patterns + ("*.bin",)
    chosen = [s for s in siblings if any(fnmatch.fnmatch(s.rfilename, p) for p in patterns)]
    if not chosen:
        raise SpeculaError(f"'{repo_id}' holds no model files to download")
    return sorted(chosen, key=lambda s: (s.rfilename == "config.json", s.rfilename))


HEAD_FILES = ("config.json", "head.json", "head.safetensors", "model.safetensors", "pytorch_model.bin",
              "medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors.index.json",
              "pytorch_model.bin.index.json")
HEAD_WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def head_strategy(folder: Path) -> str:
    """The strategy that drafts with the head in `folder` (eagle or medusa), read from its head.json or a
    published head's config.json and file names without loading it; ValueError says why a folder holds
    none. Whether the head fits a model is checked when it loads."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder")
    for name in ("head.json", "config.json"):
        path = folder / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path} is unreadable: {first_line(exc)}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a JSON object")
        if name == "head.json":
            if data.get("kind") in ("eagle", "medusa"):
                return str(data["kind"])
            raise ValueError(f"{path} describes a '{data.get('kind')}' head, which no strategy drafts with")
        medusa = (any(k.startswith("medusa") for k in data) or data.get("model_type") == "medusa"
                  or any((folder / n).is_file() for n in ("medusa_lm_head.pt", "medusa_lm_head.safetensors")))
        if medusa:
            return "medusa"
        layers = data.get("num_hidden_layers")
        if isinstance(layers, int) and layers > 2:  # an EAGLE head is one layer (a few at most): this is a model
            raise ValueError(f"{folder} holds a model ({layers} layers), not a draft head: add it under Models to "
                             "use it, or as the draft model")
        if any((folder / n).is_file() for n in HEAD_WEIGHTS):
            return "eagle"
    raise ValueError(f"{folder} holds no draft head: no head.json, and no EAGLE or Medusa config.json with its weights")


def download_head(repo_id: str, on_progress: Callable[[int, int], None] | None = None,
                  should_stop: Callable[[], bool] | None = None) -> str:
    """Download a draft head's files (Specula's, or a published EAGLE or Medusa head's) and return their folder."""
    names = {s.rfilename for s in _repo_info(repo_id).siblings or ()}
    wanted = [n for n in HEAD_FILES if n in names]
    if not any(n not in ("config.json", "head.json") for n in wanted):
        raise SpeculaError(f"'{repo_id}' holds no draft head (none of {', '.join(HEAD_FILES[2:])})")
    path = ""
    for name in wanted:
        path = download(repo_id, name, on_progress, should_stop)
        if name.endswith(".index.json"):  # a checkpoint in several files: the ones its index names
            for shard in _index_files(Path(path), names, repo_id):
                download(repo_id, shard, on_progress, should_stop)
    return str(Path(path).parent)


def weight_map(index: Path) -> dict[str, str]:
    """A split checkpoint's index (`model.safetensors.index.json` and the like): each tensor's file name.
    ValueError with the reason ("is unreadable: ...", "names no files ...") where it is unreadable or names none."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"is unreadable: {first_line(exc)}") from None
    files = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError("names no files (no weight_map)")
    return {str(k): str(v) for k, v in files.items()}


def _index_files(index: Path, names: set[str], repo_id: str) -> list[str]:
    """The files a split checkpoint's index names, each one of the repository's top-level files."""
    try:
        files = sorted(set(weight_map(index).values()))
    except ValueError as exc:
        raise SpeculaError(f"'{repo_id}': {index.name} {exc}") from None
    missing = [f for f in files if f not in names or Path(f).name != f]
    if missing:
        raise SpeculaError(f"'{repo_id}': {index.name} names {missing[0]}, which the repository does not hold")
    return files


def download(repo_id: str, filename: str | None = None, on_progress: Callable[[int, int], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> str:
    """Download a model snapshot (the files the app loads) or one file of it into the Hugging Face cache and return
    its local path. `on_progress(done, total)` in bytes and `should_stop()` (True raises Cancelled) are called
    from this thread every 64 KB; an interrupted download resumes where it stopped."""
    from huggingface_hub import constants

    info = _repo_info(repo_id)
    files = _files_to_fetch(repo_id, list(info.siblings or ()), filename)
    progress = _Progress(sum(int(s.size or 0) for s in files), on_progress, should_stop, repo_id)
    # huggingface_hub hands its progress bar one piece of DOWNLOAD_CHUNK_SIZE (10 MB): too seldom to cancel promptly
    constants.DOWNLOAD_CHUNK_SIZE = _CHUNK
    try:
        for sibling in files:
            progress.check()
            path = _fetch(repo_id, sibling.rfilename, progress)
            progress.finished(int(sibling.size or 0))
    except (Cancelled, SpeculaError):
        raise
    except Exception as exc:  # huggingface_hub's, the HTTP client's and the disk's errors, of several types
        raise _failure(repo_id, exc) from None
    if filename is not None:
        return path
    return str(Path(path).parents[files[-1].rfilename.count("/")])  # the snapshot folder the last file went into


def _failure(repo_id: str, exc: Exception) -> SpeculaError:
    """The one-line error for a download that failed: the repository is gated, the disk failed, or the Hub did."""
    from huggingface_hub import errors

    if isinstance(exc, errors.GatedRepoError):
        return SpeculaError(_gated(repo_id))
    remote = (errors.HfHubHTTPError, errors.EntryNotFoundError, ConnectionError)  # OSErrors that are not the disk's
    if isinstance(exc, OSError) and not isinstance(exc, remote):
        return SpeculaError(f"cannot write the download of '{repo_id}' to {hub_cache()}: {first_line(exc)}")
    return SpeculaError(f"cannot download '{repo_id}' from {hub_endpoint()}: {network_reason(exc)} (run the "
                        "download again to resume it)")


def _fetch(repo_id: str, name: str, progress: _Progress) -> str:
    """One file of the repository into the cache (resumed where an earlier try stopped); its snapshot path."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import repo_folder_name

    cache, endpoint = hub_cache(), hub_endpoint()
    meta = get_hf_file_metadata(hf_hub_url(repo_id, name, endpoint=endpoint))
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    if meta.etag and meta.commit_hash and not (storage / "snapshots" / meta.commit_hash / name).exists():
        _fetch_blob(meta, storage, f"{repo_id}/{name}", progress.bar)
    return hf_hub_download(repo_id, name, cache_dir=cache, endpoint=endpoint, tqdm_class=progress.bar)


def _fetch_blob(meta, storage: Path, what: str, bar: type) -> None:
    """The file's bytes into blobs/<etag>, appended to blobs/<etag>.incomplete from where an earlier try left it; that
    partial file outlives a cancel, a crash or a dropped connection."""
    from filelock import Timeout
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    blob = storage / "blobs" / meta.etag
    part = blob.with_name(blob.name + ".incomplete")
    lock = storage.parent / ".locks" / storage.name / f"{meta.etag}.lock"  # where hf_hub_download locks this blob
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    try:
        with WeakFileLock(lock, timeout=1):
            if blob.exists():
                return
            if meta.size is not None and part.exists() and part.stat().st_size > meta.size:
                part.unlink()
            with open(part, "ab") as out:
                http_get(meta.location, out, resume_size=out.tell(), headers=build_hf_headers(),
                         expected_size=meta.size, displayed_filename=what, tqdm_class=bar)
            if len(meta.etag) == 64 and _sha256(part) != meta.etag:  # an LFS file's etag is its sha256
                part.unlink()
                raise SpeculaError(f"the download of {what} was corrupted (checksum mismatch): run it again")
            os.replace(part, blob)
    except Timeout:
        raise SpeculaError(f"{what} is already being downloaded") from None


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class _Progress:
    """One download's bytes, done of its total across its files, for on_progress; should_stop() raises Cancelled.
    `bar` is the tqdm class huggingface_hub reports each file's bytes to (and so where a cancel interrupts it)."""

    def __init__(self, total: int, on_progress: Callable[[int, int], None] | None,
                 should_stop: Callable[[], bool] | None, what: str):
        self.total = total
        self.done = 0  # the bytes of the files finished
        self.report = on_progress or (lambda done, total: None)
        self.stop = should_stop or (lambda: False)
        self.what = what
        self.bar = _bar_class(self)

    def check(self) -> None:
        if self.stop():
            raise Cancelled(f"download of {self.what} cancelled")

    def show(self, file_done: int) -> None:
        self.report(self.done + file_done, self.total)

    def finished(self, size: int) -> None:
        self.done += size
        self.report(self.done, self.total)


def _bar_class(progress: _Progress) -> type:
    """A silent tqdm for huggingface_hub. Its update(n) comes before the n bytes are written, so it checks for a
    cancel first: what it showed last is then what is on disk, and the next download resumes from there."""
    from tqdm import tqdm

    class Bar(tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "disable": True})
            progress.show(self.n)

        def update(self, n: float | None = 1) -> None:
            progress.check()
            self.n += int(n or 0)
            progress.show(self.n)

    return Bar
