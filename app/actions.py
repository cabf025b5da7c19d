"""The small action links under each message: which apply to a turn, their labels and their hrefs.

Edit on the user's messages; Copy, Markdown/Tokens on answers; Regenerate on the last answer and Retry
on a last error. Links are anchors `act:<name>:<item index>` in the transcript (tokens are `t<index>`).
Pure functions, no Qt.
"""

from __future__ import annotations

EDIT, COPY, MARKDOWN, REGENERATE, RETRY = "edit", "copy", "markdown", "regenerate", "retry"
OLDER, NEWER = "older", "newer"  # browse an answer's versions
PREFIX = "act:"
TIPS = {
    EDIT: "Put this message in the composer: sending replaces it and drops everything after it",
    COPY: "Copy the answer's text (without rejected drafts)",
    MARKDOWN: "Switch between the rendered answer and its raw tokens (both coloured by where each came from)",
    REGENERATE: "Drop this answer and generate it again with the current strategy and settings",
    RETRY: "Send the last message again",
    OLDER: "Show the previous version of this answer (Alt+Left on the last one)",
    NEWER: "Show the next version of this answer (Alt+Right on the last one)",
}


def actions_for(role: str, last: bool, markdown: bool, version: tuple[int, int] = (0, 1)
                ) -> tuple[tuple[str | None, str], ...]:
    """(name, label) of the links under a turn; `last`: it ends the conversation; `version`: (which, of how
    many) versions of an answer are shown. A None name is plain text (the "2/3" between the arrows)."""
    if role == "user":
        return ((EDIT, "Edit"),)
    if role == "assistant":
        which, count = version
        browse = ()
        if count > 1:
            browse = (((OLDER, "‹"),) if which > 0 else ()) + ((None, f"{which + 1}/{count}"),) + \
                (((NEWER, "›"),) if which < count - 1 else ())
        links = browse + ((COPY, "Copy"), (MARKDOWN, "Tokens" if markdown else "Markdown"))
        return links + (((REGENERATE, "Regenerate"),) if last else ())
    if role == "error" and last:
        return ((RETRY, "Retry"),)
    return ()


MENU_LABELS = {"Edit": "Edit message", "Copy": "Copy answer", "Markdown": "Show as Markdown",
               "Tokens": "Show raw tokens", "Regenerate": "Regenerate answer", "Retry": "Retry",
               "‹": "Previous version", "›": "Next version"}


def menu_label(label: str) -> str:
    """The longer wording for a context menu, where a bare "Copy" would read as copying the selection."""
    return MENU_LABELS.get(label, label)


def href(name: str, index: int) -> str:
    return f"{PREFIX}{name}:{index}"


def parse(link: str) -> tuple[str, int] | None:
    """(name, item index) of an action href, None for anything else (a token's anchor)."""
    if not link.startswith(PREFIX):
        return None
    name, _, index = link[len(PREFIX):].partition(":")
    if name not in TIPS or not index.isdigit():
        return None
    return name, int(index)
