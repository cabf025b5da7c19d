"""The user's settings: a versioned frozen dataclass stored as JSON in the config folder.

A file that cannot be read is moved aside (`settings.json.corrupt-<timestamp>`) and replaced by the
defaults; the caller shows the notice. Out-of-range numbers are clamped, fields of the wrong type fall
back to their defaults, unknown keys are ignored. A strategy, device or dtype this version does not know (a
newer version's, a slip of the hand) is the default for the run, with a notice. A newer version's file is read
for what this version knows and never written (its own choices and fields stay for it); this version's file
takes the defaults at its next save. Window geometry lives in QSettings, not here.

Versions: 1 had no strategy options; 2 adds `lookup_min_n`, `lookup_max_n` and `exit_layer` (None: the
engine's default); 3 adds the backend (local engine or remote server) and the server's details; 4 adds
`weights` (how a GGUF's 4-bit weights run: auto, native or dequantized); 5 `allow_http_key`, 6 `auto_skip`, 7
`added_models`, 8 `eagle_trees` and `eagle_lookup` (eagle's token trees and prompt lookup's branch in them), 9
`auto_phrases` (auto may draft the model's own phrases); 10 keeps the strategies' options as the engine names them,
`strategy_options` (strategy -> option -> value, `api.strategies.STRATEGY_OPTIONS`), where 2-9 kept them in fields of
their own; 11 keeps an added draft head with the model it was added for, `draft_heads` (model source -> head folder),
where 10 kept one `draft_head` that every model was loaded with. `migrate` brings an older file's dict up to date
before it is read, so old files load.

An API key is never a setting: it comes from the environment variable named by `api_key_env` or from
the OS keyring, so it is never written to this file.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from specula.app.storage import read_json, remove_stale_temporaries, set_aside, write_json_atomic
from specula.engine.api.paths import DEVICE_NAMES, DTYPE_NAMES
from specula.engine.api.strategies import STRATEGIES, STRATEGY_OPTIONS, request_options
from specula.engine.api.types import SEED_MAX, SEED_MIN, LoadRequest, ModelChoice, RemoteLoadRequest

VERSION = 11
BACKENDS = ("local", "remote")
WEIGHTS = ("auto", "native", "dequantized")  # specula.engine.api.paths.WEIGHT_NAMES (tested equal)
FILE_NAME = "settings.json"
K_LIMIT = 16  # the engine's adaptive bound (DecodeConfig.k_max)
MAX_NEW_TOKENS_LIMIT = 32768


@dataclass(frozen=True)
class Settings:
    version: int = VERSION
    strategy: str = "auto"
    k: int = 0  # 0: the strategy's own default draft length
    adaptive_k: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 256
    system_prompt: str = ""
    model_source: str = "bundled"
    draft_source: str = ""  # empty: no draft model
    # the draft heads the user added (Models view), model source -> a folder of Specula's or a published EAGLE/Medusa
    # head, offered first to its strategy when that model loads (`draft_head`); a model without one: the heads found
    # for it. A head a load finds does not fit its model is dropped (`with_head`). Never changed in place.
    draft_heads: dict[str, str] = field(default_factory=dict)
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "auto"  # a GGUF's 4-bit weights: auto (native where it applies), native, dequantized
    # the strategies' options by the engine's names, strategy -> option -> value (STRATEGY_OPTIONS), only those
    # set: one left out is the engine's default. The chosen strategy's go with each request (GenerateRequest.options).
    # Never changed in place: `with_options` makes new Settings.
    strategy_options: dict[str, dict[str, object]] = field(default_factory=dict)
    added_models: str = ""  # model folders and GGUF files the user added in the Models view, one a line
    # the backend: "local" (this engine) or "remote" (an OpenAI-compatible server that speculates itself)
    backend: str = "local"
    server_url: str = ""
    server_model: str = ""  # empty: the server's first model
    api_key_env: str = ""  # the environment variable holding the key (empty: the OS keyring, else none)
    baseline_url: str = ""  # the same model served without speculation, for a measured speedup
    verify_tls: bool = True
    allow_http_key: bool = False  # the user allowed the API key to go unencrypted (http://) to another host

    @property
    def remote(self) -> bool:
        return self.backend == "remote"

    @property
    def draft_head(self) -> str:
        """The draft head added for the model to use ("" for none)."""
        return self.draft_heads.get(self.model_source, "")

    def with_head(self, head: str, model: str | None = None) -> "Settings":
        """These settings with `head` as the draft head of `model` (the model to use where None); "" removes it."""
        model = self.model_source if model is None else model
        heads = {source: folder for source, folder in self.draft_heads.items() if source != model}
        return replace(self, draft_heads={**heads, **({model: head} if head else {})})

    def to_dict(self) -> dict:
        return asdict(self)

    def option(self, strategy: str, name: str) -> object:
        """A strategy's option as set; None: the engine's default."""
        return self.strategy_options.get(strategy, {}).get(name)

    def with_options(self, strategy: str, **values: object) -> "Settings":
        """These settings with a strategy's options set (None: back to the engine's default)."""
        mine = {**self.strategy_options.get(strategy, {}), **values}
        mine = {name: value for name, value in mine.items() if value is not None}
        others = {name: values for name, values in self.strategy_options.items() if name != strategy}
        return replace(self, strategy_options={**others, **({strategy: mine} if mine else {})})

    def request_options(self) -> tuple[tuple[str, object], ...]:
        """The engine's GenerateRequest.options: the chosen strategy's options that are set, in the schema's order."""
        return request_options(self.strategy_options.get(self.strategy, {}))

    def load_request(self, prepare=None) -> LoadRequest | RemoteLoadRequest:
        """The engine's request to load what these settings name: a LoadRequest (this engine), or a
        RemoteLoadRequest (a server, which the engine process relays); `prepare`: an answer as the first ones
        will ask (a GenerateRequest), run as the model loads."""
        if self.remote:
            return RemoteLoadRequest(self.server_url, self.server_model, self.api_key_env, self.baseline_url,
                                     self.verify_tls, allow_http_key=self.allow_http_key)
        spec = ModelChoice(self.model_source, device=self.device, dtype=self.dtype, weights=self.weights)
        return LoadRequest(spec, draft=self.draft_source or None, measure_baseline=False,
                           draft_head=self.draft_head or None, prepare=prepare)

    @classmethod
    def from_dict(cls, data: dict) -> tuple["Settings", list[str]]:
        """Settings from a parsed file, and the names of fields that were unusable (defaults used)."""
        data = migrate(data)
        values, bad = {}, []
        for f in fields(cls):
            if f.name not in data or f.name == "version":
                continue
            if f.name == "strategy_options":
                values[f.name], unusable = read_options(data[f.name])
                bad += unusable
                continue
            if f.name == "draft_heads":
                values[f.name], unusable = read_heads(data[f.name])
                bad += unusable
                continue
            value = _coerce(f.name, data[f.name], getattr(cls(), f.name))
            if value is _BAD:
                bad.append(f.name)
            else:
                values[f.name] = value
        return clamp(cls(**values)), bad


_BAD = object()
OPTIONAL_INTS = ("seed",)


def _v1_to_v2(data: dict) -> dict:
    """Version 2 added the strategy options; a version 1 file uses the engine's defaults for them."""
    return {**data, "lookup_min_n": None, "lookup_max_n": None, "exit_layer": None, "version": 2}


def _v2_to_v3(data: dict) -> dict:
    """Version 3 added the remote backend; a version 2 file keeps the local engine."""
    remote = {"backend": "local", "server_url": "", "server_model": "", "api_key_env": "", "baseline_url": "",
              "verify_tls": True}
    return {**remote, **data, "version": 3}


def _v3_to_v4(data: dict) -> dict:
    """Version 4 added `weights`; a version 3 file runs a GGUF natively where it can (the default)."""
    return {"weights": "auto", **data, "version": 4}


def _v4_to_v5(data: dict) -> dict:
    """Version 5 added `allow_http_key`; a version 4 file never sends a key unencrypted to another host."""
    return {"allow_http_key": False, **data, "version": 5}


def _v5_to_v6(data: dict) -> dict:
    """Version 6 added `auto_skip`; a version 5 file lets auto use every strategy it can."""
    return {"auto_skip": "", **data, "version": 6}


def _v6_to_v7(data: dict) -> dict:
    """Version 7 added `added_models`; a version 6 file has added none."""
    return {"added_models": "", **data, "version": 7}


def _v7_to_v8(data: dict) -> dict:
    """Version 8 added `eagle_trees` and `eagle_lookup`; a version 7 file takes eagle's defaults (both on)."""
    return {"eagle_trees": True, "eagle_lookup": True, **data, "version": 8}


def _v8_to_v9(data: dict) -> dict:
    """Version 9 added `auto_phrases`; a version 8 file takes the default (on)."""
    return {"auto_phrases": True, **data, "version": 9}


# the fields versions 2-9 kept the strategies' options in: name -> (its strategy, its option, the JSON types it held)
OLD_OPTION_FIELDS = {
    "lookup_min_n": ("prompt-lookup", "min_n", (int, type(None))),
    "lookup_max_n": ("prompt-lookup", "max_n", (int, type(None))),
    "exit_layer": ("layer-skip", "exit_layer", (int, type(None))),
    "auto_skip": ("auto", "skip", (str,)),
    "eagle_trees": ("eagle", "tree", (bool,)),
    "eagle_lookup": ("eagle", "lookup", (bool,)),
    "auto_phrases": ("auto", "phrases", (bool,)),
}


def _v9_to_v10(data: dict) -> dict:
    """Version 10 keeps the strategies' options by the engine's names, only those set: a number left at None,
    an empty skip and a switch that is on were sent as nothing (the engine's default), a switch that is off as
    False. A value its old field could not hold stays unusable, so that it is reset with the notice."""
    options: dict[str, dict[str, object]] = {}
    for old, (strategy, name, kinds) in OLD_OPTION_FIELDS.items():
        value = data.get(old)
        if old not in data or (type(value) in kinds and (value is None or value is True or value == "")):
            continue
        options.setdefault(strategy, {})[name] = value if type(value) in kinds else _BAD
    rest = {key: value for key, value in data.items() if key not in OLD_OPTION_FIELDS}
    return {**rest, "strategy_options": options, "version": 10}


def _v10_to_v11(data: dict) -> dict:
    """Version 11 keeps each added draft head with its model: version 10's one `draft_head` was added for the model
    the file names (a load of another model that did not fit it was refused, so the model stayed). A value that
    was no text stays unusable, so that it is reset with the notice."""
    head, model = data.get("draft_head", ""), data.get("model_source", "bundled")
    rest = {key: value for key, value in data.items() if key != "draft_head"}
    if head == "" or head is None:
        heads = {}
    elif isinstance(head, str) and isinstance(model, str):
        heads = {model.strip() or "bundled": head}
    else:
        heads = _BAD
    return {**rest, "draft_heads": heads, "version": 11}


MIGRATIONS = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7, 7: _v7_to_v8,
              8: _v8_to_v9, 9: _v9_to_v10, 10: _v10_to_v11}  # version -> the step to the next version


def migrate(data: dict) -> dict:
    """An older file's fields brought up to VERSION (a file without a version is version 1)."""
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        version = 1
    while version in MIGRATIONS:
        data = MIGRATIONS[version](data)
        version += 1
    return data


def _coerce(name: str, value: object, default: object) -> object:
    if name in OPTIONAL_INTS:
        return value if value is None or (isinstance(value, int) and not isinstance(value, bool)) else _BAD
    if isinstance(default, bool):
        return value if isinstance(value, bool) else _BAD
    if isinstance(default, int):
        return value if isinstance(value, int) and not isinstance(value, bool) else _BAD
    if isinstance(default, float):  # NaN and the infinities (JSON readers take them) are no setting
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else _BAD
    return value if isinstance(value, str) else _BAD


def clamp(s: Settings) -> Settings:
    """Numbers within what the engine accepts, and names it knows (a strategy, device or dtype it has not: a newer
    version's, a typing slip) as the defaults, so a hand-edited or newer file cannot make every load or send fail."""
    default = Settings()
    return replace(
        s,
        strategy=s.strategy if s.strategy in STRATEGIES else default.strategy,
        device=s.device if s.device in DEVICE_NAMES else default.device,
        dtype=s.dtype if s.dtype in DTYPE_NAMES else default.dtype,
        k=min(max(s.k, 0), K_LIMIT),
        temperature=min(max(s.temperature, 0.0), 5.0),
        top_p=s.top_p if 0.0 < s.top_p <= 1.0 else 1.0,
        top_k=max(s.top_k, 0),
        seed=None if s.seed is None else min(max(s.seed, SEED_MIN), SEED_MAX),
        max_new_tokens=min(max(s.max_new_tokens, 1), MAX_NEW_TOKENS_LIMIT),
        model_source=s.model_source.strip() or "bundled",
        backend=s.backend if s.backend in BACKENDS else "local",
        weights=s.weights if s.weights in WEIGHTS else "auto",
        server_url=s.server_url.strip(),
        server_model=s.server_model.strip(),
        api_key_env=s.api_key_env.strip(),
        baseline_url=s.baseline_url.strip(),
        strategy_options=clean_options(s.strategy_options),
    )


def unknown_names(data: dict, settings: Settings) -> str:
    """The names a file chose that this version does not know and `clamp` replaced, with what is used instead
    ("strategy “warp” (auto is used)"); "" for none."""
    changed = [f"{name} “{data[name]}” ({getattr(settings, name)} is used)"
               for name in ("strategy", "device", "dtype")
               if isinstance(data.get(name), str) and data[name] != getattr(settings, name)]
    return ", ".join(changed)


def read_options(data: object) -> tuple[dict, list[str]]:
    """`strategy_options` from a file: each option the schema has for its strategy, in a JSON type it takes, and
    the names of those that were unusable (left out: the engine's default). Strategies and options the schema
    does not know are ignored, as unknown fields are. `clamp` then puts them in the engine's terms."""
    if not isinstance(data, dict):
        return {}, ["strategy_options"]
    options: dict[str, dict[str, object]] = {}
    bad = []
    for strategy, values in data.items():
        if not isinstance(values, dict):
            if strategy in STRATEGIES:
                bad.append(f"strategy_options.{strategy}")
            continue
        for name, value in values.items():
            option = STRATEGY_OPTIONS.get(name)
            if option is None or strategy not in option.strategies or value is None:
                continue
            if option.accepts(value):
                options.setdefault(strategy, {})[name] = value
            else:
                bad.append(f"{strategy}.{name}")
    return options, bad


def read_heads(data: object) -> tuple[dict[str, str], list[str]]:
    """`draft_heads` from a file: model source -> head folder, both texts (an empty one is no head), and the names
    of the entries that were unusable (left out)."""
    if not isinstance(data, dict):
        return {}, ["draft_heads"]
    heads, bad = {}, []
    for model, head in data.items():
        if isinstance(head, str) and model.strip():
            if head.strip():
                heads[model.strip()] = head
        else:
            bad.append(f"draft_heads.{model}")
    return heads, bad


def clean_options(options: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    """Strategy options as the engine takes them: a number below its option's bounds and an empty text mean the
    default (left out); an option above the one it must not exceed is swapped with it."""
    out = {}
    for strategy, values in options.items():
        kept = {name: value for name, value in values.items() if value is not None and value != "" and not (
            STRATEGY_OPTIONS[name].bounds and _number(value) and value < STRATEGY_OPTIONS[name].bounds[0])}
        for name in list(kept):
            other = STRATEGY_OPTIONS[name].at_most
            if other in kept and _number(kept[name]) and _number(kept[other]) and kept[name] > kept[other]:
                kept[name], kept[other] = kept[other], kept[name]
        if kept:
            out[strategy] = kept
    return out


def _number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Loaded:
    settings: Settings
    notice: str | None = None  # something the window should tell the user
    newer: bool = False  # written by a newer version: read for what this one knows, never overwritten


class SettingsStore:
    def __init__(self, folder: Path | None = None) -> None:
        if folder is None:
            from specula.engine.api.paths import config_dir

            folder = config_dir()
        self.path = Path(folder) / FILE_NAME
        self.newer = False  # the file is a newer version's: save() leaves it as it is

    def load(self) -> Loaded:
        remove_stale_temporaries(self.path)
        if not self.path.exists():
            return Loaded(Settings())
        try:
            data = read_json(self.path)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            return Loaded(Settings(), self._recover(exc))
        version = data.get("version")
        self.newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        settings, bad = Settings.from_dict(data)
        notices = [f"Some settings were unusable and were reset: {', '.join(bad)}"] if bad else []
        if "seed" not in bad and data.get("seed") != settings.seed:  # out of range: clamped into it
            notices.append(f"The seed in the settings file was out of range ({SEED_MIN} to {SEED_MAX}); "
                           f"{settings.seed} is used.")
        unknown = unknown_names(data, settings)
        if unknown:
            notices.append(f"This version of Specula does not know the saved {unknown}.")
        if self.newer:
            notices.append(f"The settings file {self.path} is from a newer version of Specula (format {version}): "
                           "this version uses what it knows of it and will not change it, so changes made now "
                           "last until Specula closes.")
        return Loaded(settings, " ".join(notices) or None, self.newer)

    def _recover(self, exc: Exception) -> str:
        try:
            moved = set_aside(self.path)
        except OSError as move_exc:
            return f"The settings file could not be read ({exc}) nor moved aside ({move_exc}); using defaults."
        return f"The settings file was unreadable and was moved to {moved.name}; defaults are in use."

    def save(self, settings: Settings) -> None:
        if not self.newer:
            write_json_atomic(self.path, settings.to_dict())
