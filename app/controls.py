"""The generation controls in the toolbar: strategy, k, adaptive k, temperature, max new tokens.

Strategies come from the engine's registry once a model is loaded (the list is empty until then);
ones the loaded model cannot use (e.g. `draft-model` without a draft model) are shown disabled. A
change applies to the next message; nothing is reloaded. Connected to a server, the strategy is the
server's own ("server", the only entry) and k does not apply; the saved local strategy is kept.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QCheckBox, QComboBox, QDoubleSpinBox, QHBoxLayout, QLabel, QSpinBox, QWidget

from specula.app.settings import K_LIMIT, MAX_NEW_TOKENS_LIMIT, Settings

SERVER_TIP = ("The server's own speculative decoding: it is configured where the server is started "
              "(e.g. vLLM's --speculative-config)")


class Controls(QWidget):
    changed = Signal()  # the user changed a value

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.remote = False  # connected to a server: the strategy shown is "server", not a setting
        self.strategy = QComboBox()
        self.strategy.setMinimumContentsLength(13)
        self.strategy.setToolTip("How tokens are drafted (applies to the next message)")
        self.k = _spin(QSpinBox(), 0, K_LIMIT, "Longest draft: tokens proposed per step (auto: the strategy's own)")
        self.k.setSpecialValueText("auto")
        self.adaptive = QCheckBox("adaptive")
        self.adaptive.setToolTip("Grow k after fully accepted drafts, shrink it after rejections")
        self.temperature = _spin(QDoubleSpinBox(), 0.0, 2.0, "0 is greedy (the model's most likely token)")
        self.temperature.setSingleStep(0.1)
        self.temperature.setDecimals(2)
        self.max_tokens = _spin(QSpinBox(), 1, MAX_NEW_TOKENS_LIMIT, "Longest answer, in tokens")
        self.max_tokens.setSingleStep(64)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 0, 4, 0)
        layout.setSpacing(6)
        for label, widget in (("Strategy", self.strategy), ("k", self.k), (None, self.adaptive),
                              ("Temperature", self.temperature), ("Max tokens", self.max_tokens)):
            if label:
                text = QLabel(label)
                text.setBuddy(widget)
                layout.addSpacing(6)
                layout.addWidget(text)
            layout.addWidget(widget)
        self.strategy.activated.connect(lambda _: self.changed.emit())
        for signal in (self.k.valueChanged, self.temperature.valueChanged, self.max_tokens.valueChanged,
                       self.adaptive.toggled):
            signal.connect(lambda *_: self.changed.emit())

    def show_settings(self, s: Settings) -> None:
        """Show `s` without emitting `changed`."""
        widgets = (self.strategy, self.k, self.adaptive, self.temperature, self.max_tokens)
        for w in widgets:
            w.blockSignals(True)
        try:
            self._select_strategy(s.strategy)
            self.k.setValue(s.k)
            self.adaptive.setChecked(s.adaptive_k)
            self.temperature.setValue(s.temperature)
            self.max_tokens.setValue(s.max_new_tokens)
        finally:
            for w in widgets:
                w.blockSignals(False)

    def applied_to(self, s: Settings) -> Settings:
        strategy = s.strategy if self.remote else self.strategy.currentData() or s.strategy
        return replace(s, strategy=strategy, k=self.k.value(), adaptive_k=self.adaptive.isChecked(),
                       temperature=round(self.temperature.value(), 2), max_new_tokens=self.max_tokens.value())

    def set_strategies(self, infos, usable, current: str) -> str:
        """Fill the combo from the registry (name -> StrategyInfo); returns the strategy now selected."""
        self.strategy.blockSignals(True)
        try:
            self._set_remote(False)
            self.strategy.clear()
            model = self.strategy.model()
            for row, (name, info) in enumerate(infos.items()):
                self.strategy.addItem(name, name)
                self.strategy.setItemData(row, info.description, Qt.ItemDataRole.ToolTipRole)
                if name not in usable and isinstance(model, QStandardItemModel):
                    model.item(row).setEnabled(False)
                    self.strategy.setItemData(row, f"{info.description} (not available for this model)",
                                              Qt.ItemDataRole.ToolTipRole)
            choice = current if current in usable else _fallback(usable)
            self._select_strategy(choice)
        finally:
            self.strategy.blockSignals(False)
        return self.strategy.currentData() or current

    def set_server(self) -> None:
        """A server is connected: its own speculation is the only strategy; k and adaptive k do not apply."""
        self.strategy.blockSignals(True)
        try:
            self._set_remote(True)
            self.strategy.clear()
            self.strategy.addItem("server", "server")
            self.strategy.setItemData(0, SERVER_TIP, Qt.ItemDataRole.ToolTipRole)
            self.strategy.setCurrentIndex(0)
        finally:
            self.strategy.blockSignals(False)

    def _set_remote(self, remote: bool) -> None:
        self.remote = remote
        for widget in (self.k, self.adaptive):
            widget.setEnabled(not remote)

    def _select_strategy(self, name: str) -> None:
        if self.remote:
            return  # the combo shows "server"; the saved strategy waits for a local model
        index = self.strategy.findData(name)
        if index < 0:  # the registry is not loaded yet: show the saved choice alone
            self.strategy.addItem(name, name)
            index = self.strategy.findData(name)
        self.strategy.setCurrentIndex(index)


def _fallback(usable) -> str:
    for name in ("auto", "prompt-lookup", "none"):
        if name in usable:
            return name
    return next(iter(usable), "none")


def _spin(spin, low, high, tip: str):
    spin.setRange(low, high)
    spin.setToolTip(tip)
    spin.setKeyboardTracking(False)
    return spin
