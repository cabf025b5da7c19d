"""Where Specula keeps its files. One APP_ID names the app everywhere (desktop file, metainfo, dirs)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_ID = "io.github.specula.Specula"
APP_NAME = "specula"
DEVICE_NAMES = ("auto", "cpu", "cuda", "mps")
DTYPE_NAMES = ("auto", "fp32", "bf16", "fp16")  # names the GUI can list without importing torch
WEIGHT_NAMES = ("auto", "native", "dequantized")  # how a GGUF's 4-bit weights run (loading.ModelSpec)


def cache_dir() -> Path:
    """Converted model weights and other things that can be rebuilt. SPECULA_CACHE_DIR overrides."""
    return Path(os.environ.get("SPECULA_CACHE_DIR") or platformdirs.user_cache_dir(APP_NAME))


def config_dir() -> Path:
    return Path(os.environ.get("SPECULA_CONFIG_DIR") or platformdirs.user_config_dir(APP_NAME))


def data_dir() -> Path:
    return Path(os.environ.get("SPECULA_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))
