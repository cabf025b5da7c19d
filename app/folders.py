"""Where the file dialogs open: the folder last chosen for that kind of file in this run, else the place such
files usually are (a model: Downloads; an export: Documents), else the home folder. Never the folder the
process was started in, which for a desktop app is wherever its launcher ran it."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QStandardPaths

Location = QStandardPaths.StandardLocation
PLACES = {"model": (Location.DownloadLocation, Location.DocumentsLocation),
          "export": (Location.DocumentsLocation,)}
_LAST: dict[str, str] = {}  # kind -> the folder last chosen from


def start_folder(kind: str) -> str:
    last = _LAST.get(kind)
    if last and Path(last).is_dir():
        return last
    for place in PLACES.get(kind, ()):
        folder = QStandardPaths.writableLocation(place)
        if folder and Path(folder).is_dir():
            return folder
    return str(Path.home())


def chosen(kind: str, path: str) -> str:
    """`path` as the dialog returned it ("" when cancelled); its folder is where the next one of `kind` opens."""
    if path:
        where = Path(path)
        _LAST[kind] = str(where if where.is_dir() else where.parent)
    return path
