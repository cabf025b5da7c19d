"""`specula export --model M --out DIR`: the model as a plain safetensors folder that serving engines
(vLLM, SGLang) load. A GGUF file (the bundled model included) is written dequantized to fp32 there (the
one place Specula makes such a copy, because the folder is asked for); a folder or Hub snapshot is copied.
The config names its architecture, which engines need to pick the model class.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..api.errors import SpeculaError
from ..api.paths import is_gguf, make_folder

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def _source(model: str) -> tuple[Path, bool]:
    """The model's file or folder, and whether it is a GGUF."""
    from ..models.loading import bundled_gguf_path

    if model == "bundled":
        return bundled_gguf_path(), True
    path = Path(model).expanduser()
    if path.is_file() and is_gguf(path):
        return path, True
    if path.is_dir() and (path / "config.json").is_file():
        return path, False
    raise SpeculaError(f"cannot export '{model}': give bundled, a .gguf file or a model folder with config.json")


def _identity(path: Path) -> str:
    """The source as exported: its path, and for a file its size and time (a new download exports again)."""
    if path.is_dir():
        return str(path.resolve())
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def export(model: str, out: Path, overwrite: bool = False) -> Path:
    out = make_folder(Path(out), "--out")  # before a GGUF is read
    src, is_gguf = _source(model)
    identity = _identity(src)
    if out.exists() and any(out.iterdir()):
        if not overwrite and (out / "specula-export.json").is_file() and _same_source(out, identity):
            return out  # already exported from this very source
        if not overwrite:
            raise SpeculaError(f"{out} is not empty: choose another folder or pass --overwrite")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    if is_gguf:
        _write_dequantized(src, out)
    else:
        for item in src.iterdir():
            if item.is_file():
                shutil.copy2(item, out / item.name)
    config = json.loads((out / "config.json").read_text())
    if not config.get("architectures"):
        arch = ARCHITECTURES.get(config.get("model_type", ""))
        if arch is None:
            raise SpeculaError(f"the model's config names no architecture and its type "
                               f"'{config.get('model_type')}' is not one Specula knows")
        config["architectures"] = [arch]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "specula-export.json").write_text(json.dumps({"source": identity}))
    return out


def _write_dequantized(path: Path, out: Path) -> None:
    """A GGUF file's model dequantized to fp32, as safetensors with its config and tokenizer in `out`."""
    import torch

    from ..models import from_gguf

    print(f"[dequantizing {path.name} to fp32]", file=sys.stderr, flush=True)
    model, tokenizer, _ = from_gguf.load(path, torch.device("cpu"), torch.float32, "dequantized")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _same_source(out: Path, identity: str) -> bool:
    try:
        return json.loads((out / "specula-export.json").read_text()).get("source") == identity
    except (OSError, ValueError):
        return False


def run_export(args) -> int:
    folder = export(args.model, args.out, args.overwrite)
    print(folder)
    return 0
