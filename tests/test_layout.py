"""The house's layout (docs/ENGINE.md): the engine's rooms stand in layers, each importing only the rooms
below it, no module imports itself back through others, and the window imports the torch-free rooms
only. Imports inside functions count as much as those at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# from the ground up: a room may import rooms of a lower layer (and itself)
LAYERS = ("api", "remote", "cpu", "decoding", "models", "heads", "drafters", "serving", "cli")
APP_MAY_IMPORT = {"api", "remote"}  # the window's process never loads torch


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "specula." + ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """specula.* module -> the specula.* modules it imports, anywhere in its code."""
    files = {_module(p): p for folder in ("engine", "app") for p in (ROOT / folder).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in files and t != name}
        graph[name] = edges
    return graph


def room(module: str) -> str:
    """specula.engine.decoding.loop -> decoding; specula.app.window -> app; the engine's root -> ''."""
    parts = module.split(".")
    if parts[1] == "app":
        return "app"
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in LAYERS) else ""


def test_the_import_graph_has_no_circles():
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_every_room_imports_only_the_rooms_below_it():
    rank = {name: i for i, name in enumerate(LAYERS)}
    wrong = []
    for module, targets in import_graph().items():
        here = room(module)
        for target in targets:
            there = room(target)
            if here == "app":
                ok = there == "app" or there in APP_MAY_IMPORT
            elif here in rank:
                ok = there == here or there in rank and rank[there] < rank[here]
            else:
                ok = True  # the engine's root (its version) stands above nothing
            if not ok:
                wrong.append(f"{module} -> {target}")
    assert not wrong, "\n".join(wrong)


def test_the_engines_root_holds_only_its_rooms():
    loose = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules outside the engine's rooms: {loose}"
    rooms = sorted(p.name for p in (ROOT / "engine").iterdir() if (p / "__init__.py").is_file())
    assert rooms == sorted(LAYERS)


def test_the_graph_reader_sees_deferred_and_relative_imports():
    graph = import_graph()
    # serving.session imports heads.train inside a function, and decoding's loop its sibling verify
    assert "specula.engine.heads.train" in graph["specula.engine.serving.session"]
    assert "specula.engine.decoding.verify" in graph["specula.engine.decoding.loop"]
    assert room("specula.engine.decoding.loop") == "decoding" and room("specula.app.window") == "app"


def test_the_models_room_keeps_its_files_short_and_families_in_their_own():
    """No module of the models room runs past about 500 lines; the forwards (runner, layers, attention, block, compiled,
    static) name no family and ask no module what it has (`hasattr`): a family's knowledge is its file under
    families/, read through the model's spec."""
    from specula.engine.models.families import families

    names = {t for f in families().values() for t in (*f.model_types, *f.gguf_archs, f.name)}
    models = ROOT / "engine" / "models"
    for path in models.rglob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) <= 520, path.name
    for stem in ("runner", "layers", "attention", "block", "compiled", "static"):
        tree = ast.parse((models / f"{stem}.py").read_text(encoding="utf-8"))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & names, (stem, strings & names)
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "hasattr"]
        assert not calls, (stem, [ast.unparse(c) for c in calls])


def _private_names(path: Path, cls: str) -> set[str]:
    """The private names class `cls` of `path` holds: its methods and the attributes it sets on itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    names = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    names |= {a.attr for a in ast.walk(node) if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self"}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_runners_state_has_one_owner():
    """The cache (models/cache.py) owns the positions a runner holds and the runner its own choices: no other module
    reaches a private name of either, and the passes (compiled.py, static.py, block.py) go through their public
    names. A name read off anything but `self` counts, so a private of another object of the same name counts too."""
    models = ROOT / "engine" / "models"
    private = _private_names(models / "runner.py", "LeanRunner") | _private_names(models / "cache.py", "Cache")
    assert {"_check", "_tables", "_forward"} <= private  # the reader sees both classes' own
    reached = []
    for path in [*(ROOT / "engine").rglob("*.py"), *(ROOT / "app").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        if path == models / "cache.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in private
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                reached.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not reached, reached
    assert len((models / "runner.py").read_text(encoding="utf-8").splitlines()) <= 200  # it chooses a pass; the passes live apart


def test_a_models_spec_is_read_where_it_is_loaded():
    """spec_of(config) runs where a model is loaded (loading.py, from_gguf.py) and in the families' own module; the
    forwards read the loaded model's spec, computed once (`spec_for`)."""
    models = ROOT / "engine" / "models"
    callers = set()
    for path in models.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "spec_of" for n in ast.walk(tree)):
            callers.add(path.relative_to(models).as_posix())
    assert callers <= {"loading.py", "from_gguf.py", "families/__init__.py"}, callers


def test_the_gguf_reader_names_no_family():
    """What a family's files hold is the family's (families/): gguf.py and from_gguf.py hold no family's name."""
    from specula.engine.models.families import families

    names = {t for f in families().values() for t in (*f.model_types, *f.gguf_archs, f.name)}
    for stem in ("gguf", "from_gguf"):
        tree = ast.parse((ROOT / "engine" / "models" / f"{stem}.py").read_text(encoding="utf-8"))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & names, (stem, strings & names)
