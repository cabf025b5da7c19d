"""Settings > Strategies: every draft strategy, whether the loaded model can use it and what it needs
otherwise, its options (a field for each StrategyOption shown under it: a check box for a switch, a number
whose lowest value reads "default"), which one is in use (the toolbar's choice: the two stay in step), and
which ones `auto` may choose from (its option `skip`)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QButtonGroup,
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from specula.app.settings import Settings, clean_options
from specula.app.theme import mute
from specula.engine.api.strategies import STRATEGIES, STRATEGY_OPTIONS, StrategyOption, shown_options

AUTO_MEMBERS = ("prompt-lookup", "suffix", "lookahead", "eagle", "medusa")  # what auto chooses from, when it can


class StrategiesPage(QWidget):
    def __init__(self, settings: Settings, usable: tuple[str, ...] | None, parent=None) -> None:
        """`usable`: the strategies the loaded model can use (None: no model loaded yet)."""
        super().__init__(parent)
        self._settings = settings
        self._local = True
        self.usable = usable
        self.choice = QButtonGroup(self)
        self.buttons: dict[str, QRadioButton] = {}
        self.allow: dict[str, QCheckBox] = {}
        self.options: dict[tuple[str, str], QWidget] = {}  # (strategy, option) -> its field
        skipped = {name.strip() for name in str(settings.option("auto", "skip") or "").split(",") if name.strip()}
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
            for option in shown_options(name):
                widget = self.options[(name, option.name)] = _field(option, settings.option(name, option.name))
                line = QWidget()
                fields = QHBoxLayout(line)
                fields.setContentsMargins(0, 0, 0, 4)
                if not option.switch:  # a switch's words are its check box's own
                    fields.addWidget(QLabel(option.label))
                fields.addWidget(widget)
                fields.addStretch(1)
                grid.addWidget(line, row, 1)
                row += 1
                if option.switch:
                    widget.toggled.connect(self._enable_options)
        grid.setColumnStretch(1, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(grid)
        layout.addStretch(1)
        self._enable_options()

    def set_local(self, local: bool) -> None:
        """The options act on this engine only: greyed while a remote server is chosen."""
        self._local = local
        self._enable_options()

    def _enable_options(self) -> None:
        for (strategy, name), widget in self.options.items():
            switch = self.options.get((strategy, STRATEGY_OPTIONS[name].requires))  # it acts under that one only
            widget.setEnabled(self._local and (switch is None or switch.isChecked()))

    def values(self) -> dict:
        """The page's Settings fields: the strategy in use and the strategies' options."""
        chosen = next((name for name, button in self.buttons.items() if button.isChecked()), None)
        skip = ",".join(name for name, box in self.allow.items() if not box.isChecked())
        s = self._settings.with_options("auto", skip=skip or None)
        for (strategy, name), widget in self.options.items():
            s = s.with_options(strategy, **{name: _value(STRATEGY_OPTIONS[name], widget)})
        return {"strategy_options": clean_options(s.strategy_options), **({"strategy": chosen} if chosen else {})}


def _field(option: StrategyOption, value: object) -> QWidget:
    """The field for an option, showing `value` (None: the engine's default)."""
    if option.switch:
        widget = QCheckBox(option.label, checked=bool(option.default if value is None else value))
    elif int in option.kinds:  # its lowest value reads "default": the engine's own choice
        low, high = option.bounds or (1, 2**31 - 1)
        widget = QSpinBox(minimum=low - 1, maximum=high, specialValueText="default",
                          value=value if isinstance(value, int) else low - 1)
    else:
        widget = QLineEdit(str(value or ""))
        widget.setPlaceholderText("default")
    if option.tip:
        widget.setToolTip(option.tip)
    return widget


def _value(option: StrategyOption, widget: QWidget) -> object:
    """An option's value from its field; None: the engine's default."""
    if isinstance(widget, QCheckBox):
        on = widget.isChecked()
        return None if on == bool(option.default) else on
    if isinstance(widget, QSpinBox):
        return None if widget.value() == widget.minimum() else widget.value()
    return widget.text().strip() or None


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
