"""The Settings dialog: the model and draft model to load, device and dtype, the system prompt and
the sampling details that are not in the toolbar (top-p, top-k, seed)."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtWidgets import (QComboBox, QDialog, QDialogButtonBox, QDoubleSpinBox, QFileDialog, QFormLayout,
                               QHBoxLayout, QLabel, QLineEdit, QPlainTextEdit, QPushButton, QSpinBox, QVBoxLayout,
                               QWidget)

from .settings import Settings

MODEL_HINT = "bundled, a Hugging Face Hub id (org/name), a local folder or a .gguf file"


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        self._settings = settings
        from engine.loading import DEVICES, DTYPES  # the engine is loaded by the time this opens

        self.model = QLineEdit(settings.model_source)
        self.model.setPlaceholderText(MODEL_HINT)
        self.draft = QLineEdit(settings.draft_source)
        self.draft.setPlaceholderText("none (needed only by the draft-model strategy)")
        self.device = _combo(DEVICES, settings.device)
        self.dtype = _combo(("auto", *DTYPES), settings.dtype)
        self.system = QPlainTextEdit(settings.system_prompt)
        self.system.setPlaceholderText("Optional instructions sent before every conversation")
        self.system.setFixedHeight(90)
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.01, maximum=1.0, singleStep=0.05, value=settings.top_p)
        self.top_k = QSpinBox(minimum=0, maximum=100000, value=settings.top_k, specialValueText="off")
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1, specialValueText="random",
                             value=-1 if settings.seed is None else settings.seed)
        form = QFormLayout()
        form.addRow("Model", _with_browse(self.model, self))
        form.addRow("Draft model", _with_browse(self.draft, self))
        form.addRow("Device", self.device)
        form.addRow("Precision", self.dtype)
        form.addRow("System prompt", self.system)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Seed", self.seed)
        note = QLabel("Changing the model, draft model, device or precision reloads the model.")
        note.setWordWrap(True)
        note.setStyleSheet("color: palette(placeholder-text);")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(note)
        layout.addWidget(buttons)

    def result_settings(self) -> Settings:
        return replace(
            self._settings,
            model_source=self.model.text().strip() or "bundled",
            draft_source=self.draft.text().strip(),
            device=self.device.currentText(),
            dtype=self.dtype.currentText(),
            system_prompt=self.system.toPlainText(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            seed=None if self.seed.value() < 0 else self.seed.value(),
        )


def needs_reload(old: Settings, new: Settings) -> bool:
    keys = ("model_source", "draft_source", "device", "dtype")
    return any(getattr(old, k) != getattr(new, k) for k in keys)


def _combo(values, current: str) -> QComboBox:
    box = QComboBox()
    box.addItems(list(values))
    box.setCurrentText(current)
    return box


def _with_browse(edit: QLineEdit, parent) -> QWidget:
    def browse() -> None:
        path, _ = QFileDialog.getOpenFileName(parent, "Choose a model file", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            edit.setText(path)

    button = QPushButton("Browse…")
    button.clicked.connect(browse)
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    layout.addWidget(button)
    return row
