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
        # one label that wraps, so a narrow window puts the key on two lines instead of growing
        self.key = QLabel()
        self.key.setWordWrap(True)
        self.key.setToolTip("<br>".join(f"<b>{caption}</b>: {ORIGIN_NAMES[origin]}" for origin, caption in LEGEND))
        layout.addWidget(self.key, 1)
        self.ghosts = QCheckBox("Show rejected drafts")
        self.ghosts.setChecked(False)
        self.ghosts.setToolTip("Draft tokens the model rejected, struck through where they were proposed")
        self.ghosts.toggled.connect(self.ghosts_toggled)
        layout.addWidget(self.ghosts)
        self.set_colours(colours)

    def set_colours(self, colours: OriginColours) -> None:
        items = []
        for origin, caption in LEGEND:
            caption = caption.replace(" ", "&nbsp;")  # lines break between the entries, not inside one
            colour = colours.of(origin)
            style = f"color:{colour};" if colour else ""
            if origin == "rejected":
                items.append(f"<span style='{style}text-decoration:line-through;'>{caption}</span>")
            else:
                items.append(f"<span style='{style}'>■&nbsp;{caption}</span>")
        self.key.setText(" &nbsp;&nbsp; ".join(items))
