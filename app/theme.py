"""Colours for token origins, readable on light and dark backgrounds.

Two palettes (GitHub's light and dark accent shades, chosen for contrast against their backgrounds);
`palette_for(is_dark)` picks one from the window's base colour. Plain target tokens use the normal
text colour; rejected drafts are struck-through grey "ghost" text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OriginColours:
    draft: str
    correction: str
    bonus: str
    target: str | None  # None: the palette's text colour
    rejected: str
    user_bubble: str
    assistant_bubble: str
    error_bubble: str
    error_text: str
    muted: str

    def of(self, origin: str) -> str | None:
        return getattr(self, origin, None)


LIGHT = OriginColours(
    draft="#1a7f37", correction="#bc4c00", bonus="#0969da", target=None, rejected="#8c959f",
    user_bubble="#eef2f8", assistant_bubble="#ffffff", error_bubble="#ffebe9", error_text="#a40e26",
    muted="#656d76",
)
DARK = OriginColours(
    draft="#3fb950", correction="#f0883e", bonus="#58a6ff", target=None, rejected="#6e7681",
    user_bubble="#262c36", assistant_bubble="#1b1f26", error_bubble="#3c1e22", error_text="#ff7b72",
    muted="#8d96a0",
)

LEGEND = (
    ("draft", "accepted draft"),
    ("correction", "correction"),
    ("bonus", "bonus"),
    ("target", "model token"),
    ("rejected", "rejected draft"),
)


def palette_for(is_dark: bool) -> OriginColours:
    return DARK if is_dark else LIGHT
