"""The small action links under each message: which apply to a turn, their labels and their hrefs.

Edit on the user's messages; Copy, Markdown/Tokens on answers; Regenerate on the last answer and Retry
on a last error. Links are anchors `act:<name>:<item index>` in the transcript (tokens are `t<index>`).
Pure functions, no Qt.
"""

from __future__ import annotations

EDIT, COPY, MARKDOWN, REGENERATE, RETRY = "edit", "copy", "markdown", "regenerate", "retry"
PREFIX = "act:"
TIPS = {
    EDIT: "Put this message in the composer: sending replaces it and drops everything after it",
    COPY: "Copy the answer's text (without rejected drafts)",
    MARKDOWN: "Switch between the rendered answer and its raw tokens (both coloured by where each came from)",
    REGENERATE: "Drop this answer and generate it again with the current strategy and settings",
    RETRY: "Send the last message again",
}


def actions_for(role: str, last: bool, markdown: bool) -> tuple[tuple[str, str], ...]:
    """(name, label) of the links under a turn; `last`: it ends the conversation."""
    if role == "user":
        return ((EDIT, "Edit"),)
    if role == "assistant":
        links = ((COPY, "Copy"), (MARKDOWN, "Tokens" if markdown else "Markdown"))
        return links + (((REGENERATE, "Regenerate"),) if last else ())
    if role == "error" and last:
        return ((RETRY, "Retry"),)
    return ()


MENU_LABELS = {"Edit": "Edit message", "Copy": "Copy answer", "Markdown": "Show as Markdown",
               "Tokens": "Show raw tokens", "Regenerate": "Regenerate answer", "Retry": "Retry"}


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
