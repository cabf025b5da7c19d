"""The strip above the transcript: what each token colour means, and the ghost-text toggle."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Signal
from PySide6.QtWidgets import QCheckBox, QLabel, QWidget

from specula.app.flow import FlowLayout
from specula.app.theme import LEGEND, OriginColours, is_dark, palette_for

# what each colour means for the answer and for the speed (a label's tooltip)
TIPS = {
    "draft": "Guessed by the drafter and confirmed by the model in one pass: these tokens come almost free. "
             "The more of them, the higher the speedup.",
    "correction": "Where the model disagreed with a guess, its own token replaces the first rejected one: the "
                  "answer stays exactly the model's own.",
    "bonus": "Every guess of a step was accepted, so the same pass gave one more token, the model's own.",
    "target": "A plain step: nothing was drafted (or the drafter sat this step out), the model made this token "
              "alone, as without speculation.",
    "rejected": "A guess the model did not accept. Never part of the answer; struck through where it was "
                "proposed when Show rejected drafts is on.",
}


class LegendBar(QWidget):
    ghosts_toggled = Signal(bool)

    def __init__(self, colours: OriginColours, parent=None) -> None:
        super().__init__(parent)
        layout = FlowLayout(self, spacing=14)  # a narrow window wraps the key onto more lines
        layout.setContentsMargins(14, 6, 14, 2)
        # one label an entry, so lines break between entries
        self.entries = {origin: QLabel() for origin, _ in LEGEND}
        for origin, label in self.entries.items():
            label.setToolTip(TIPS[origin])
        self.ghosts = QCheckBox("Show rejected drafts")
        self.ghosts.setChecked(False)
        self.ghosts.setToolTip("Draft tokens the model rejected, struck through where they were proposed")
        self.ghosts.toggled.connect(self.ghosts_toggled)
        # the rejected drafts' key after the check box that shows them: turning it on adds the key to the right
        # rather than pushing the box along under the pointer
        for origin, label in self.entries.items():
            if origin != "rejected":
                layout.addWidget(label)
        layout.addWidget(self.ghosts)
        layout.addWidget(self.entries["rejected"])
        self.set_colours(colours)

    def set_colours(self, colours: OriginColours) -> None:
        for origin, caption in LEGEND:
            colour = colours.of(origin)
            style = f"color:{colour};" if colour else ""
            if origin == "rejected":
                text = f"<span style='{style}text-decoration:line-through;'>{caption}</span>"
            else:
                text = f"<span style='{style}'>■&nbsp;{caption}</span>"
            self.entries[origin].setText(text)

    def changeEvent(self, event) -> None:
        """Light or dark: the key takes the token colours of the new palette, as the transcript does."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.set_colours(palette_for(is_dark(self)))

    def show_rejected(self, show: bool) -> None:
        """The rejected drafts' key shows only while they are drawn."""
        self.entries["rejected"].setVisible(show)
        self.layout().invalidate()
