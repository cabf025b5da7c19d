"""`specula export --model M --out DIR`: the model as a plain safetensors folder that serving engines
(vLLM, SGLang) load. A GGUF file (the bundled model included) is dequantized to fp32 first; a folder
or Hub snapshot is copied. The config names its architecture, which engines need to pick the model class.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..api.errors import SpeculaError
from ..api.paths import make_folder

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}


def source_folder(model: str) -> Path:
    """A local safetensors folder holding `model` (converted on first use for a GGUF file)."""
    from ..models.loading import _converted_gguf, bundled_gguf_path

    def say(text: str) -> None:
        print(f"[{text}]", file=sys.stderr, flush=True)

    if model == "bundled":
        return _converted_gguf(bundled_gguf_path(), say)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return _converted_gguf(path, say)
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise SpeculaError(f"cannot export '{model}': give bundled, a .gguf file or a model folder with config.json")


def export(model: str, out: Path, overwrite: bool = False) -> Path:
    out = make_folder(Path(out), "--out")  # before a GGUF is converted
    src = source_folder(model)
    if out.exists() and any(out.iterdir()):
        if not overwrite and (out / "specula-export.json").is_file() and _same_source(out, src):
            return out  # already exported from this very source
        if not overwrite:
            raise SpeculaError(f"{out} is not empty: choose another folder or pass --overwrite")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name != "done.json":
            shutil.copy2(item, out / item.name)
    config = json.loads((out / "config.json").read_text())
    if not config.get("architectures"):
        arch = ARCHITECTURES.get(config.get("model_type", ""))
        if arch is None:
            raise SpeculaError(f"the model's config names no architecture and its type "
                               f"'{config.get('model_type')}' is not one Specula knows")
        config["architectures"] = [arch]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "specula-export.json").write_text(json.dumps({"source": str(src)}))
    return out


def _same_source(out: Path, src: Path) -> bool:
    try:
        return json.loads((out / "specula-export.json").read_text()).get("source") == str(src)
    except (OSError, ValueError):
        return False


def run_export(args) -> int:
    folder = export(args.model, args.out, args.overwrite)
    print(folder)
    return 0
