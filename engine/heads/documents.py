"""Long texts to paste into training prompts (summarise, answer from, extract from, translate a part of), taken
from what ships on the machine, never from an evaluation set:
- Python's own documentation: the docstrings of the standard library's modules, read from their source files
  (parsed, not imported: importing runs code);
- the documentation of the installed Python packages (their README, from each distribution's metadata);
- licence texts (Debian's /usr/share/common-licenses);
- manual pages (/usr/share/man, with the roff markup stripped);
- for translation into English: the translated messages of the programs' message catalogs
  (/usr/share/locale/LANG/LC_MESSAGES/*.mo: German, French, Spanish, Italian, Portuguese, Dutch);
- for short factual questions: the country, currency and language names of the iso-codes package
  (/usr/share/iso-codes/json), the installed commands' and the standard library modules' names.

Every source is optional: a machine without manual pages or licences gives the others. Texts are cut at
paragraph boundaries to MIN_CHARS..MAX_CHARS characters (a few hundred to about a thousand tokens).
"""

from __future__ import annotations

import ast
import functools
import gettext
import gzip
import json
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

MIN_CHARS = 700
MAX_CHARS = 4000
MAN_DIRS = (Path("/usr/share/man/man1"), Path("/usr/share/man/man5"), Path("/usr/share/man/man8"))
LICENCE_DIR = Path("/usr/share/common-licenses")
LOCALE_DIR = Path("/usr/share/locale")
ISO_CODES_DIR = Path("/usr/share/iso-codes/json")
CATALOG_LANGUAGES = {"de": "German", "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese", "nl": "Dutch"}


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


TASKS_FIRST = (
    "Summarize: {text}", "Summarize the following text.\n\n{text}", "Write a short summary of this:\n\n{text}",
    "{text}\n\nWhat is this text about?", "Answer the question using the text.\nQuestion: {question}\nText: {text}",
)
QUESTIONS_ABOUT = ("What does it do?", "Who is it for?", "What are its limitations?", "How do I start using it?",
                   "What options does it mention?")
TASK_FIRST_SHARE = 0.35  # of pasted texts, how many come after their task (as in "Summarize: ...")


def document_prompt(doc: Document, rng: random.Random) -> str:
    """A user message that pastes `doc` and asks one thing about it, after the text or (TASK_FIRST_SHARE)
    before it."""
    if rng.random() < TASK_FIRST_SHARE:
        return rng.choice(TASKS_FIRST).format(text=doc.text, question=rng.choice(QUESTIONS_ABOUT))
    task = rng.choice(TASKS).format(language=rng.choice(LANGUAGES))
    lead = rng.choice(("", "Here is a text:\n\n", "Read the following document.\n\n", "Text:\n"))
    return f"{lead}{doc.text}\n\n{task}"


def _plain_message(text: str) -> bool:
    """A catalog message that reads as a sentence: 6 to 60 words, no format codes, markup or line breaks."""
    words = text.split()
    return (6 <= len(words) <= 60 and not re.search(r"[%{}<>\\\n\t|]|\$\w|--|_\w", text.strip())
            and sum(c.isalpha() for c in text) > 0.7 * len(text.replace(" ", "")))


def catalog_sentences(per_language: int = 1500, seed: int = 0,
                      root: Path | None = None) -> list[tuple[str, str]]:
    """(language name, a translated message) from the message catalogs of CATALOG_LANGUAGES: up to
    `per_language` sentences each, chosen at random among the plain ones (`_plain_message`). The machine's
    own catalogs are read once per process (a few seconds)."""
    if root is None:
        return list(_system_catalog_sentences(per_language, seed))
    return _catalog_sentences(per_language, seed, root)


@functools.lru_cache(maxsize=4)
def _system_catalog_sentences(per_language: int, seed: int) -> tuple[tuple[str, str], ...]:
    return tuple(_catalog_sentences(per_language, seed, LOCALE_DIR))


def _catalog_sentences(per_language: int, seed: int, root: Path) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for code, language in CATALOG_LANGUAGES.items():
        found = set()
        for path in sorted((root / code / "LC_MESSAGES").glob("*.mo")):
            try:
                with path.open("rb") as f:
                    catalog = gettext.GNUTranslations(f)._catalog
            except (OSError, ValueError, UnicodeDecodeError, KeyError):
                continue
            found.update(v.strip() for k, v in catalog.items()
                         if isinstance(k, str) and k and isinstance(v, str) and v != k and _plain_message(v))
        chosen = sorted(found)
        rng.shuffle(chosen)
        out += [(language, text) for text in chosen[:per_language]]
    rng.shuffle(out)
    return out


TO_ENGLISH = (
    "Translate {language} to English: {text}", "Translate into English: {text}",
    "Translate this {language} sentence into English.\n\n{text}", "What does this mean in English? \"{text}\"",
    "{text}\n\nTranslate the text above from {language} into English.",
)


def translation_prompt(language: str, text: str, rng: random.Random) -> str:
    return rng.choice(TO_ENGLISH).format(language=language, text=text)


def _iso_names(name: str, key: str) -> list[str]:
    try:
        entries = json.loads((ISO_CODES_DIR / f"iso_{name}.json").read_text(encoding="utf-8"))[name]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return sorted({e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)
                   and (key == "any" or key in e)})


QUESTIONS = {
    "country": ("What is the capital of {x}?", "Where is {x} located?", "Which languages are spoken in {x}?",
                "What currency is used in {x}?", "What is {x} known for?", "When did {x} become independent?",
                "What is the population of {x}, roughly?", "Who is the head of state of {x}?",
                "What is the highest mountain in {x}?", "What are the main exports of {x}?"),
    "currency": ("Which country uses the {x}?", "What is the {x}?", "Is the {x} still in use?"),
    "language": ("Where is {x} spoken?", "How many people speak {x}?", "Which language family does {x} belong to?",
                 "What alphabet is {x} written in?"),
    "command": ("What does the {x} command do?", "How do I use {x} on Linux?", "What is {x} used for?"),
    "module": ("What is Python's {x} module for?", "How do I import and use the {x} module in Python?"),
}


@functools.lru_cache(maxsize=1)
def question_subjects() -> dict[str, list[str]]:
    """{kind of QUESTIONS: names to ask about}, from what ships on the machine (kinds without names left out)."""
    commands = sorted({p.name.split(".")[0] for d in MAN_DIRS if d.is_dir() for p in d.glob("*.gz")})
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    modules = sorted(p.stem for p in stdlib.glob("*.py") if not p.stem.startswith("_"))
    found = {"country": _iso_names("3166-1", "any"), "currency": _iso_names("4217", "any"),
             "language": _iso_names("639-2", "alpha_2"), "command": commands, "module": modules}
    return {kind: names for kind, names in found.items() if names}


def question_prompt(subjects: dict[str, list[str]], rng: random.Random) -> str | None:
    """A short factual question about something named on the machine (None when nothing is)."""
    if not subjects:
        return None
    kind = rng.choice(sorted(subjects))
    return rng.choice(QUESTIONS[kind]).format(x=rng.choice(subjects[kind]))
