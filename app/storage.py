"""Files that must never be half-written: atomic JSON writes, and setting a corrupt file aside."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path


def write_json_atomic(path: Path, data: object) -> None:
    """Write `data` as JSON to a temporary file in the same folder, then rename it over `path`.

    A reader sees the old file or the new one, never a mix; a failure leaves the old file untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, ensure_ascii=False, indent=1)  # serialise first: a bad value fails here
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_stale_temporaries(path: Path, older_than_s: float = 60.0) -> None:
    """Delete the temporary files a write of `path` left behind when the app was killed mid-write (a
    write in progress, of another window, is younger than `older_than_s`)."""
    now = time.time()
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            if now - tmp.stat().st_mtime > older_than_s:
                tmp.unlink()
        except OSError:
            pass


def read_json(path: Path) -> object:
    """The parsed file (after a UTF-8 byte-order mark, as some editors write); raises ValueError (corrupt, or
    nested deeper than Python's reader goes) or OSError (unreadable)."""
    text = path.read_text(encoding="utf-8-sig")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def set_aside(path: Path) -> Path:
    """Rename a corrupt file to `<name>.corrupt-<timestamp>` (kept for the user) and return the new path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, target)
    return target
