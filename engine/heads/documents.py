"""Long texts to paste into training prompts (summarise, answer from, extract from, translate a part of), taken
from what ships on the machine, never from an evaluation set:
- Python's own documentation: the docstrings of the standard library's modules, read from their source files
  (parsed, not imported: importing runs code);
- the documentation of the installed Python packages (their README, from each distribution's metadata);
- licence texts (Debian's /usr/share/common-licenses);
- manual pages (/usr/share/man, with the roff markup stripped).

Every source is optional: a machine without manual pages or licences gives the others. Texts are cut at
paragraph boundaries to MIN_CHARS..MAX_CHARS characters (a few hundred to about a thousand tokens).
"""

from __future__ import annotations

import ast
import functools
import gzip
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MIN_CHARS = 700
MAX_CHARS = 4000
MAN_DIRS = (Path("/usr/share/man/man1"), Path("/usr/share/man/man5"), Path("/usr/share/man/man8"))
LICENCE_DIR = Path("/usr/share/common-licenses")


@dataclass(frozen=True)
class Document:
    source: str  # where it came from, e.g. "python:json", "readme:numpy", "licence:Apache-2.0", "man:ls"
    text: str


def _cut(text: str, rng: random.Random) -> str | None:
    """A piece of `text` of MIN_CHARS..MAX_CHARS characters, from a paragraph's start to a paragraph's end
    where one falls in that range (else cut at MAX_CHARS)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    start = rng.randrange(max(1, len(paragraphs) - 2)) if paragraphs else 0
    piece = ""
    for p in paragraphs[start:]:
        joined = f"{piece}\n\n{p}" if piece else p
        if len(joined) > MAX_CHARS:
            piece = piece if len(piece) >= MIN_CHARS else joined[:MAX_CHARS]
            break
        piece = joined
    return piece if len(piece) >= MIN_CHARS else None


def _api_text(tree: ast.Module) -> str:
    """A module's documentation as pydoc lays it out: its docstring, then each public class and function
    with its signature and docstring (methods indented under their class)."""
    parts = [ast.get_docstring(tree) or ""]

    def walk(nodes, indent: str) -> None:
        for node in nodes:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            if isinstance(node, ast.ClassDef):
                head = f"class {node.name}"
            else:
                head = f"{node.name}({ast.unparse(node.args)})"
            parts.append(indent + head + "\n" + "\n".join(indent + "    " + line for line in doc.splitlines()))
            if isinstance(node, ast.ClassDef) and not indent:
                walk(node.body, indent + "    ")

    walk(tree.body, "")
    return "\n\n".join(p for p in parts if p)


def python_docs() -> list[tuple[str, str]]:
    """(module, its documentation) for the standard library's modules, from their source files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/__init__.py")):
        try:
            text = _api_text(ast.parse(path.read_text(encoding="utf-8", errors="replace")))
        except (SyntaxError, ValueError, OSError, RecursionError):
            continue
        if len(text) >= MIN_CHARS:
            out.append((path.parent.name if path.name == "__init__.py" else path.stem, text))
    return out


def readmes() -> list[tuple[str, str]]:
    """(distribution, README) of the installed Python packages."""
    from importlib.metadata import distributions

    out = {}
    for dist in distributions():
        try:
            body = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
            name = dist.metadata["Name"] or ""
        except Exception:  # noqa: BLE001 - a damaged metadata file: skip that package
            continue
        if isinstance(body, str) and len(body) >= MIN_CHARS and name:
            out.setdefault(name.lower(), body)
    return sorted(out.items())


def licences() -> list[tuple[str, str]]:
    out = []
    if LICENCE_DIR.is_dir():
        for path in sorted(LICENCE_DIR.iterdir()):
            if path.is_file() and not path.is_symlink():
                out.append((path.name, path.read_text(encoding="utf-8", errors="replace")))
    return out


_ROFF_FONT = re.compile(r"\\f[A-Z0-9]|\\f\(..|\\f\[[^\]]*\]")
_ROFF_ESCAPE = re.compile(r"\\\((..)|\\\[([^\]]*)\]|\\[-&|^e]|\\s[+-]?\d")


def _roff_text(source: str) -> str:
    """A manual page's text without its roff markup: macros dropped, section headings kept as lines."""
    lines = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".SH", ".SS")):
            lines.append("\n" + line[3:].strip().strip('"') + "\n")
            continue
        if line.startswith((".PP", ".P", ".LP", ".TP", ".IP", ".sp", ".br")):
            lines.append("")
            tag = re.match(r'\.IP\s+"([^"]*)"', line) or re.match(r"\.IP\s+(\S+)", line)
            if tag and "\\(bu" not in tag.group(1) and tag.group(1) not in ("\\(em", "-"):
                lines.append(_ROFF_ESCAPE.sub(lambda m: "-" if m.group(0) == "\\-" else "", _ROFF_FONT.sub("", tag.group(1))))
            continue
        if line.startswith((".B ", ".I ", ".BR ", ".IR ", ".BI ", ".RB ", ".RI ")):
            line = " ".join(part.strip('"') for part in line.split()[1:])
        elif line.startswith("."):
            continue
        line = _ROFF_FONT.sub("", line)
        line = _ROFF_ESCAPE.sub(lambda m: "-" if m.group(0) == "\\-" else "", line)
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def man_pages(limit: int = 400, seed: int = 0) -> list[tuple[str, str]]:
    """(command, text) of up to `limit` manual pages, chosen at random among those installed."""
    paths = [p for d in MAN_DIRS if d.is_dir() for p in sorted(d.glob("*.gz"))]
    random.Random(seed).shuffle(paths)
    out = []
    families: dict[str, int] = {}  # at most 3 pages of a family (gcloud_*, git-*): variety over volume
    for path in paths:
        if len(out) >= limit:
            break
        family = re.split(r"[_.-]", path.name, maxsplit=1)[0]
        if families.get(family, 0) >= 3:
            continue
        families[family] = families.get(family, 0) + 1
        try:
            text = _roff_text(gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace"))
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        if len(text) >= MIN_CHARS and ".so " not in text[:10]:
            out.append((path.name.split(".")[0], text))
    return out


@functools.lru_cache(maxsize=4)
def shipped_documents(seed: int = 0) -> tuple[Document, ...]:
    """Every source's texts, cut to size, in a fixed order for a seed (read once per process: a few seconds)."""
    rng = random.Random(seed)
    docs = []
    for kind, items in (("python", python_docs()), ("readme", readmes()), ("licence", licences()),
                        ("man", man_pages(seed=seed))):
        for name, text in items:
            piece = _cut(text, rng)
            if piece is not None:
                docs.append(Document(f"{kind}:{name}", piece))
    rng.shuffle(docs)
    return tuple(docs)


TASKS = (
    "Summarize the text above in three sentences.",
    "Summarize the text above for someone who has never used it, in one short paragraph.",
    "Write a bullet-point summary of the text above.",
    "What is the main purpose of what the text above describes? Answer from the text only.",
    "List every option, function, command or term the text above names, with a short explanation of each.",
    "Extract all numbers, dates and version numbers from the text above and say what each refers to.",
    "According to the text above, what are the conditions or limitations a user must know about?",
    "Answer from the text above: who is this for, and what problem does it solve?",
    "Write three questions a reader might ask about the text above, and answer each from the text.",
    "Explain the text above in simple terms, as if to a beginner.",
    "Rewrite the first paragraph of the text above in plain language.",
    "Translate the first two sentences of the text above into {language}.",
    "Give a one-line title for the text above, then its three key points.",
)
LANGUAGES = ("French", "Spanish", "German", "Italian", "Portuguese", "Chinese")


def document_prompt(doc: Document, rng: random.Random) -> str:
    """A user message that pastes `doc` and asks one thing about it."""
    task = rng.choice(TASKS).format(language=rng.choice(LANGUAGES))
    lead = rng.choice(("", "Here is a text:\n\n", "Read the following document.\n\n", "Text:\n"))
    return f"{lead}{doc.text}\n\n{task}"
