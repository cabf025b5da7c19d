"""Conversations: what a conversation, a turn and a token record are, how they read and write as JSON
(the export, and the files of earlier versions), and what of them is sent to the model.

Each assistant turn keeps its tokens (text, origin, step, draft position, p, q, and where known the
token-tree branch and whether the origin was inferred from a server's stream) so a reopened
conversation shows the same colours and ghost drafts. They are stored in `history_db.py`.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field, replace

FORMAT = 1
TITLE_CHARS = 48
# the latest time a chat's date may be (9999-12-30 UTC): later ones, and any before 1970, are no time a date can
# show (Python's datetime stops at the year 9999), so they are read as unknown
TIME_MAX = 253_402_128_000.0


@dataclass(frozen=True)
class TokenRecord:
    text: str
    origin: str  # an specula.engine.api.events.Origin value: draft, correction, bonus, target, rejected
    step: int = 0
    draft_pos: int | None = None
    p: float | None = None
    q: float | None = None
    branch: str | None = None  # a token-tree step: which branch the model kept
    inferred: bool = False  # a server's token: its origin was inferred from the stream's chunks
    drafter: str | None = None  # auto's choice of drafter for the token's step

    def to_list(self) -> list:
        """Optional elements only when set, so older files and readers keep working."""
        row = [self.text, self.origin, self.step, self.draft_pos, self.p, self.q]
        if self.drafter is not None:
            return row + [self.branch, self.inferred, self.drafter]
        if self.inferred:
            return row + [self.branch, True]
        return row + [self.branch] if self.branch is not None else row

    @classmethod
    def from_list(cls, row: list) -> "TokenRecord":
        text, origin, step, draft_pos, p, q, *rest = row
        branch = rest[0] if rest and isinstance(rest[0], str) else None
        inferred = len(rest) > 1 and rest[1] is True
        drafter = rest[2] if len(rest) > 2 and isinstance(rest[2], str) else None
        if not isinstance(text, str) or not isinstance(origin, str):
            raise ValueError("a token needs a text and an origin")
        return cls(text, origin, int(step), draft_pos, p, q, branch, inferred, drafter)


@dataclass(frozen=True)
class Turn:
    role: str  # "user", "assistant" or "error" (shown, never sent to the model)
    content: str
    tokens: tuple[TokenRecord, ...] = ()
    summary: str = ""
    note: str = ""  # shown above an answer, e.g. that earlier turns were left out to fit the context
    interrupted: bool = False  # an answer cut short when the app stopped: kept, shown, never sent again
    # the answer's other versions (Regenerate keeps the earlier ones), oldest first; this one is shown and sent,
    # and sits at `position` among them all (-1: after the others, the newest)
    versions: tuple["Turn", ...] = ()
    position: int = -1

    @property
    def all_versions(self) -> tuple["Turn", ...]:
        """Every version of this answer, oldest first (this one among them, without their own versions)."""
        at = self.version
        return self.versions[:at] + (replace(self, versions=(), position=-1),) + self.versions[at:]

    @property
    def version(self) -> int:
        """Which of `all_versions` this is."""
        return len(self.versions) if self.position < 0 else min(self.position, len(self.versions))

    def showing(self, i: int) -> "Turn":
        """This answer with version i shown (and sent with later messages)."""
        every = self.all_versions
        i = max(0, min(i, len(every) - 1))
        return replace(every[i], versions=every[:i] + every[i + 1 :], position=i)

    def replacing(self, earlier: "Turn") -> "Turn":
        """This new answer, keeping `earlier` (and its versions) as the versions before it."""
        return replace(self, versions=earlier.all_versions, position=-1)

    def to_dict(self) -> dict:
        out = {"role": self.role, "content": self.content}
        if self.tokens:
            out["tokens"] = [t.to_list() for t in self.tokens]
        if self.summary:
            out["summary"] = self.summary
        if self.note:
            out["note"] = self.note
        if self.interrupted:
            out["interrupted"] = True
        if self.versions:
            out["versions"] = [v.to_dict() for v in self.versions]
            out["position"] = self.version
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Turn":
        role, content = data["role"], data["content"]
        if role not in ("user", "assistant", "error") or not isinstance(content, str):
            raise ValueError(f"bad turn {role!r}")
        tokens = tuple(TokenRecord.from_list(row) for row in data.get("tokens", ()))
        versions = tuple(cls.from_dict(v) for v in data.get("versions", ()) if isinstance(v, dict))
        position = data.get("position", -1)
        return cls(role, content, tokens, str(data.get("summary", "")), str(data.get("note", "")),
                   data.get("interrupted") is True, versions, position if isinstance(position, int) else -1)


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    turns: tuple[Turn, ...] = ()

    def with_turn(self, turn: Turn) -> "Conversation":
        title = self.title
        if turn.role == "user" and not any(t.role == "user" for t in self.turns) and self.title == "New chat":
            title = make_title(turn.content)
        return replace(self, title=title, turns=self.turns + (turn,), updated=time.time())

    def truncated(self, n: int) -> "Conversation":
        """The first n turns (regenerating or editing drops what came after). A title made from a first message
        that goes goes with it, so that the message sent in its place titles the chat as a new chat's first does
        (an edited first message); a title the user gave stays."""
        first = next((i for i, t in enumerate(self.turns) if t.role == "user"), None)
        made = first is not None and first >= n and self.title == make_title(self.turns[first].content)
        return replace(self, title="New chat" if made else self.title, turns=self.turns[:n], updated=time.time())

    def to_dict(self) -> dict:
        return {"format": FORMAT, "id": self.id, "title": self.title, "created": self.created,
                "updated": self.updated, "turns": [t.to_dict() for t in self.turns]}

    @classmethod
    def from_dict(cls, data: dict) -> "Conversation":
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ValueError("not a conversation")
        turns = tuple(Turn.from_dict(t) for t in data.get("turns", ()))
        created = sane_time(data.get("created"))
        return cls(data["id"], str(data.get("title") or "New chat"), created,
                   sane_time(data.get("updated")) or created, turns)  # a damaged date: the chat's first one


def sane_time(value: object) -> float:
    """A stored date (seconds since 1970) as one a chat can have, or 0.0 (unknown) for what is none: text that is no
    number, NaN, the infinities, a date before 1970 or after the year 9999 (a date in milliseconds, say)."""
    if isinstance(value, bool):
        return 0.0
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer too large for a float
        return 0.0
    return seconds if math.isfinite(seconds) and 0.0 < seconds <= TIME_MAX else 0.0


def make_title(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def new_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def chat_messages(conversation: Conversation, system_prompt: str = "") -> tuple:
    """The conversation as engine Messages for the chat template. Errors are left out, and so is a user
    message that failed (a prompt too long for the model would otherwise break every later turn), or
    whose answer was interrupted (with the part of the answer there is): an unanswered message would
    otherwise run into the next one."""
    from specula.engine.api.prompts import Message

    head = (Message("system", system_prompt),) if system_prompt.strip() else ()
    turns = conversation.turns
    body = []
    for i, t in enumerate(turns):
        after = turns[i + 1] if i + 1 < len(turns) else None
        failed = t.role == "user" and after is not None and (after.role == "error" or after.interrupted)
        if (t.role == "user" and not failed) or (t.role == "assistant" and t.content and not t.interrupted):
            body.append(Message(t.role, t.content))
    return head + tuple(body)


def to_markdown(conversation: Conversation) -> str:
    """A conversation for people: the title, then each message under its author."""
    names = {"user": "You", "assistant": "Assistant", "error": "Error"}
    parts = [f"# {conversation.title}", ""]
    for t in conversation.turns:
        label = names.get(t.role, t.role) + (" (interrupted)" if t.interrupted else "")
        parts += [f"**{label}**", "", closed_fences(t.content.rstrip()), ""]
        if t.summary:
            parts += [f"*{t.summary}*", ""]
    return "\n".join(parts)


def closed_fences(text: str) -> str:
    """`text` with a code block it leaves open (an answer cut by the token limit or stopped) closed at its end, so
    that what follows it in a Markdown file (the footer, the next message) is not read as code. A fence is three or
    more backticks or tildes at the start of a line; it is closed by a line of the same character, at least as
    many, and nothing else (CommonMark), indented as it was (a fence in a list item)."""
    opened = None  # (indent, fence) of the block open at this line
    for line in text.splitlines():
        body = line.lstrip()
        run = len(body) - len(body.lstrip(body[:1])) if body[:1] in ("`", "~") else 0
        if run < 3:
            continue
        fence, rest = body[:run], body[run:]
        if opened is None and not (fence[0] == "`" and "`" in rest):  # a backtick fence's language has none
            opened = (line[: len(line) - len(body)], fence)
        elif opened is not None and fence[0] == opened[1][0] and run >= len(opened[1]) and not rest.strip():
            opened = None
    return text if opened is None else f"{text}\n{opened[0]}{opened[1]}"
