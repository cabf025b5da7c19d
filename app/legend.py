"""The strip above the transcript: what each token colour means, and the ghost-text toggle."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QWidget

from .theme import LEGEND, OriginColours
from .tokens import ORIGIN_NAMES


class LegendBar(QWidget):
    ghosts_toggled = Signal(bool)

    def __init__(self, colours: OriginColours, parent=None) -> None:
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(14, 6, 14, 2)
        layout.setSpacing(14)
        self.labels: dict[str, tuple[QLabel, str]] = {}
        for origin, caption in LEGEND:
            label = QLabel()
            label.setToolTip(ORIGIN_NAMES[origin])
            self.labels[origin] = (label, caption)
            layout.addWidget(label)
        layout.addStretch(1)
        self.ghosts = QCheckBox("Show rejected drafts")
        self.ghosts.setChecked(True)
        self.ghosts.setToolTip("Draft tokens the model rejected, struck through where they were proposed")
        self.ghosts.toggled.connect(self.ghosts_toggled)
        layout.addWidget(self.ghosts)
        self.set_colours(colours)

    def set_colours(self, colours: OriginColours) -> None:
        for origin, (label, caption) in self.labels.items():
            colour = colours.of(origin)
            style = f"color:{colour};" if colour else ""
            if origin == "rejected":
                style += "text-decoration:line-through;"
            label.setText(f"<span style='{style}'>■ {caption}</span>" if origin != "rejected"
                          else f"<span style='{style}'>{caption}</span>")
