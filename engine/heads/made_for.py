"""Whether a draft head can fit a model, told before the model is read: what the head's own file says it was made
for (Specula's head.json: the target's width, the layers an EAGLE-3 head reads, the target's name; a published
head's config.json: the hidden size it names) against the model's header (a GGUF's metadata, a folder's or a cached
Hub model's config.json). Only a certain misfit is said here (another width, layers the model has not); a head
whose file names the same width may still be another model's, which `store.load_head` tells once the weights are
read (their fingerprint)."""

from __future__ import annotations

import json
from pathlib import Path

from ..api.errors import SpeculaError
from ..api.paths import BUNDLED_NAME, bundled_gguf_path, local_source
from ..api.types import BUNDLED, ModelChoice


def unfit_before_loading(head: str, spec: ModelChoice) -> str | None:
    """Why the draft head in folder `head` cannot draft for the model `spec` names, in one line; None where it may
    (or where either file does not say: the load then tells)."""
    made = _made_for(Path(head).expanduser())
    model = _model_sizes(spec.source)
    if made is None or model is None:
        return None
    width, layers, made_for = made
    name, model_width, model_layers = model
    for_whom = made_for or "another model"
    if width and model_width and width != model_width:
        return (f"the draft head in {head} was made for {for_whom} ({width} wide), not {name} "
                f"({model_width} wide)")
    if layers and model_layers and max(layers) >= model_layers:
        return (f"the draft head in {head} reads layer {max(layers)}, which {name} has not ({model_layers} layers): "
                f"it was made for {for_whom}")
    return None


def _made_for(folder: Path) -> tuple[int, tuple[int, ...], str] | None:
    """(the target's width, the target layers the head reads, the target's name) as the head's file gives them;
    None for a folder holding no head file that says."""
    if not folder.is_dir():
        return None
    if (folder / "head.json").is_file():
        from .store import read_info

        try:
            info = read_info(folder)
        except SpeculaError:  # the load says what is wrong with it
            return None
        config = info.config
        return config.target_hidden or config.hidden, tuple(config.aux_layers), info.target_name
    from .published import _config, made_for_model, named_hidden_size

    try:
        config = _config(folder)
        width = named_hidden_size(config) if config is not None else None
    except (SpeculaError, TypeError, ValueError, AttributeError, RecursionError):
        return None
    return (width, (), made_for_model(config)) if width else None


def _model_sizes(source: str) -> tuple[str, int, int] | None:
    """(the model's name as a load gives it, its hidden size, its layers) from its header, reading no weights;
    None where they are not there to read (a Hub model not in the cache, an unknown layout)."""
    source = source.strip()
    try:
        if source == BUNDLED:
            return _gguf_sizes(bundled_gguf_path(), BUNDLED_NAME)
        kind, path = local_source(source)  # what the load would read: a GGUF, a folder, or a Hub id
        if kind == "gguf":
            return _gguf_sizes(path, path.name)
        if kind == "folder":
            return _config_sizes(path / "config.json", path.name)
        from huggingface_hub import try_to_load_from_cache  # a Hub id: its config where the cache has it

        cached = try_to_load_from_cache(source, "config.json")
        return _config_sizes(Path(cached), source) if isinstance(cached, str) else None
    except (OSError, SpeculaError, ValueError, RecursionError):
        return None


def _gguf_sizes(path: Path, name: str) -> tuple[str, int, int] | None:
    from ..api.gguf_header import read_header

    meta = read_header(path, lambda key: key == "general.architecture"
                       or key.endswith((".embedding_length", ".block_count")), tensors=False).metadata
    arch = str(meta.get("general.architecture", ""))
    return _sized(name, meta.get(f"{arch}.embedding_length"), meta.get(f"{arch}.block_count"))


def _config_sizes(path: Path, name: str) -> tuple[str, int, int] | None:
    config = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return _sized(name, text.get("hidden_size"), text.get("num_hidden_layers"))


def _sized(name: str, width: object, layers: object) -> tuple[str, int, int] | None:
    whole = lambda n: isinstance(n, int) and not isinstance(n, bool) and n > 0  # noqa: E731
    return (name, width, layers if whole(layers) else 0) if whole(width) else None
