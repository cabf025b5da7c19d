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
    draft="#3fb950", correction="#f0883e", bonus="#58a6ff", target=None, rejected="#8b949e",  # 5:1 on its bubble
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


def is_dark(widget) -> bool:
    """Whether `widget` is drawn on a dark background (its palette's base colour)."""
    from PySide6.QtGui import QPalette

    return widget.palette().color(QPalette.ColorRole.Base).lightness() < 128


THEMES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))


def dark_palette():
    """A dark QPalette for the Fusion style, in the shades of the DARK token colours' backgrounds."""
    from PySide6.QtGui import QColor, QPalette

    p = QPalette()
    roles = QPalette.ColorRole
    for role, colour in ((roles.Window, "#1f2329"), (roles.WindowText, "#e6edf3"), (roles.Base, "#161a20"),
                         (roles.AlternateBase, "#1f2329"), (roles.ToolTipBase, "#2d333b"),
                         (roles.ToolTipText, "#e6edf3"), (roles.Text, "#e6edf3"), (roles.Button, "#272c34"),
                         (roles.ButtonText, "#e6edf3"), (roles.BrightText, "#ff7b72"), (roles.Link, "#58a6ff"),
                         (roles.Highlight, "#1f6feb"), (roles.HighlightedText, "#ffffff"),
                         (roles.PlaceholderText, "#8d96a0"), (roles.Mid, "#30363d"), (roles.Dark, "#0d1117"),
                         (roles.Light, "#3a414a"), (roles.Midlight, "#30363d"), (roles.Shadow, "#010409")):
        p.setColor(role, QColor(colour))
    for role in (roles.Text, roles.WindowText, roles.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor("#6e7681"))
    return p


def _dark_style():
    """Fusion, with check boxes and radio buttons framed in the muted text colour: Fusion frames them a shade
    darker than the window, which on a dark palette left them nearly invisible."""
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QColor, QPainter, QPalette, QPen
    from PySide6.QtWidgets import QProxyStyle, QStyle

    class VisibleChecks(QProxyStyle):
        def drawPrimitive(self, element, option, painter, widget=None):  # noqa: N802 - Qt's name
            super().drawPrimitive(element, option, painter, widget)
            if element not in (QStyle.PrimitiveElement.PE_IndicatorCheckBox,
                               QStyle.PrimitiveElement.PE_IndicatorRadioButton):
                return
            painter.save()
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            painter.setPen(QPen(QColor(option.palette.color(QPalette.ColorRole.PlaceholderText)), 1))
            painter.setBrush(QColor(0, 0, 0, 0))
            rect = QRectF(option.rect).adjusted(0.5, 0.5, -0.5, -0.5)
            if element == QStyle.PrimitiveElement.PE_IndicatorRadioButton:
                painter.drawEllipse(rect)
            else:
                painter.drawRoundedRect(rect, 2, 2)
            painter.restore()

    return VisibleChecks("Fusion")


def system_is_dark(app) -> bool:
    from PySide6.QtCore import Qt

    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


def apply_theme(app, theme: str) -> bool:
    """Colour the whole app: "light", "dark", or "system" (the desktop's choice, where it says one).
    Returns whether it is dark now. Dark uses the Fusion style, which draws every widget from the palette."""
    dark = theme == "dark" or (theme == "system" and system_is_dark(app))
    if dark:
        app.setStyle(_dark_style())
        app.setPalette(dark_palette())
    else:
        app.setPalette(app.style().standardPalette())
    return dark


def mute(label, point_size: float | None = None) -> None:
    """Draw a label's text in the palette's muted colour (and smaller), following later palette changes
    (a style sheet's palette(...) is read once, so a switch to dark would leave it dark on dark)."""
    from PySide6.QtGui import QPalette

    label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
    if point_size is not None:
        font = label.font()
        font.setPointSizeF(point_size)
        label.setFont(font)
