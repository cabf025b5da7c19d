"""Settings > Strategies: every draft strategy, whether the loaded model can use it and what it needs
otherwise, its options, which one is in use (the toolbar's choice: the two stay in step), and which ones
`auto` may choose from."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from specula.app.settings import Settings
from specula.app.theme import mute

AUTO_MEMBERS = ("prompt-lookup", "suffix", "lookahead", "eagle", "medusa")  # what auto chooses from, when it can


class StrategiesPage(QWidget):
    def __init__(self, settings: Settings, usable: tuple[str, ...] | None,
                 options: dict[str, list[tuple[str, QWidget]]], parent=None) -> None:
        """`usable`: the strategies the loaded model can use (None: no model loaded yet); `options`: the
        option fields to show under a strategy (name -> [(label, widget)])."""
        super().__init__(parent)
        from specula.engine.api.strategies import STRATEGIES  # torch-free

        self.usable = usable
        self.choice = QButtonGroup(self)
        self.buttons: dict[str, QRadioButton] = {}
        self.allow: dict[str, QCheckBox] = {}
        skipped = {name.strip() for name in settings.auto_skip.split(",") if name.strip()}
        intro = QLabel("The strategy in use is the toolbar's too. Untick a strategy to keep <b>auto</b> from "
                       "choosing it (auto measures each and picks per step; it never changes the answer).")
        intro.setWordWrap(True)
        grid = QGridLayout()
        grid.setHorizontalSpacing(12)
        grid.setVerticalSpacing(2)
        grid.addWidget(_header("Use"), 0, 0)
        grid.addWidget(_header("Strategy"), 0, 1)
        grid.addWidget(_header("In auto"), 0, 2)
        row = 1
        for name, card in STRATEGIES.items():
            button = QRadioButton(name)
            can = usable is None or name in usable
            button.setEnabled(can)
            button.setChecked(name == settings.strategy)
            self.choice.addButton(button)
            self.buttons[name] = button
            grid.addWidget(button, row, 0)
            about = QLabel(f"{card.description}<br><i>{_status(card, usable)}</i>")
            about.setWordWrap(True)
            mute(about)
            grid.addWidget(about, row, 1)
            if name in AUTO_MEMBERS:
                box = QCheckBox()
                box.setChecked(name not in skipped)
                box.setToolTip(f"Let auto choose {name} when it measures faster here")
                self.allow[name] = box
                grid.addWidget(box, row, 2)
            row += 1
            for label, widget in options.get(name, ()):
                line = QWidget()
                fields = QHBoxLayout(line)
                fields.setContentsMargins(0, 0, 0, 4)
                if label:
                    fields.addWidget(QLabel(label))
                fields.addWidget(widget)
                fields.addStretch(1)
                grid.addWidget(line, row, 1)
                row += 1
        grid.setColumnStretch(1, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(grid)
        layout.addStretch(1)

    def values(self) -> dict:
        """The page's Settings fields."""
        chosen = next((name for name, button in self.buttons.items() if button.isChecked()), None)
        skip = ",".join(name for name, box in self.allow.items() if not box.isChecked())
        return {"auto_skip": skip, **({"strategy": chosen} if chosen else {})}


def _status(card, usable: tuple[str, ...] | None) -> str:
    if usable is not None and card.name in usable:
        return "available for the loaded model"
    needs = card.needs
    if needs is None:
        return "needs nothing extra" if usable is None else "not available for the loaded model"
    how = {"a draft model": "set one under General > Draft model",
           "a trained eagle head": "train one with File > Train a draft head…",
           "a trained medusa head": "train one with File > Train a draft head…"}.get(needs, "")
    return f"needs {needs}" + (f": {how}" if how else "")


def _header(text: str) -> QLabel:
    label = QLabel(f"<b>{text}</b>")
    return label
