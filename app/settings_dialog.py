"""The Settings dialog: the backend (this engine or a remote server), the model and draft model to load,
device and dtype, the system prompt, the sampling details that are not in the toolbar (top-p, top-k,
seed), the remote server's details (`remote_settings.py`) and, on the Strategies page (`strategies_page.py`),
the strategies and their options ("default" leaves one to the engine). The fields of the backend not chosen
are disabled."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QRegularExpression, Qt
from PySide6.QtGui import QRegularExpressionValidator
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from specula.app.corpus_section import CorpusSection
from specula.app.focus import keyboard_back
from specula.app.folders import chosen, start_folder
from specula.app.remote_settings import RemoteSection
from specula.app.settings import Settings
from specula.app.strategies_page import StrategiesPage
from specula.app.theme import mute
from specula.engine.api.types import SEED_MAX, SEED_MIN

MODEL_HINT = "bundled, a Hugging Face Hub id (org/name), a local folder or a .gguf file"
BACKENDS = (("Local engine", "local"), ("Remote server", "remote"))
LOCAL_KEYS = ("model_source", "draft_source", "draft_heads", "device", "dtype", "weights")
REMOTE_KEYS = ("server_url", "server_model", "api_key_env", "baseline_url", "verify_tls", "allow_http_key")
LOAD_KEYS = ("backend",) + LOCAL_KEYS + REMOTE_KEYS  # what a Load request is made from


class SettingsDialog(QDialog):
    def __init__(self, settings: Settings, parent=None, usable: tuple[str, ...] | None = None, history=None) -> None:
        """`usable`: the strategies the loaded model can use (the Strategies page says what the others need);
        `history`: the conversation history (ConversationDB), whose earlier answers the Strategies page can clear."""
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.setMinimumWidth(520)
        self._settings = settings
        from specula.engine.api.paths import (  # torch-free: the dialog may open before a model loads
            DEVICE_NAMES,
            DTYPE_NAMES,
            WEIGHT_NAMES,
        )

        self.backend = QComboBox()
        for text, value in BACKENDS:
            self.backend.addItem(text, value)
        self.backend.setCurrentIndex(max(0, self.backend.findData(settings.backend)))
        self.backend.setToolTip("Run models in this app, or chat through an OpenAI-compatible server (e.g. vLLM) "
                                "that does its own speculative decoding")
        self.remote = RemoteSection(settings)
        self.model = QLineEdit(settings.model_source)
        self.model.setPlaceholderText(MODEL_HINT)
        self.draft = QLineEdit(settings.draft_source)
        self.draft.setPlaceholderText("none (needed only by the draft-model strategy)")
        self.device = _combo(DEVICE_NAMES, settings.device)
        self.dtype = _combo(DTYPE_NAMES, settings.dtype)
        self.weights = _combo(WEIGHT_NAMES, settings.weights)
        self.weights.setToolTip("A GGUF model's 4-bit weights: native runs them as they are (CPU, bf16; about twice "
                                "as fast), dequantized expands them to the precision above, auto is native where "
                                "it applies")
        self.system = QPlainTextEdit(settings.system_prompt)
        self.system.setPlaceholderText("Optional instructions sent before every conversation")
        self.system.setFixedHeight(90)
        self.top_p = QDoubleSpinBox(decimals=2, minimum=0.01, maximum=1.0, singleStep=0.05, value=settings.top_p)
        self.top_k = QSpinBox(minimum=0, maximum=100000, value=settings.top_k, specialValueText="off")
        self.seed = SeedField(settings.seed)
        model_row, draft_row = _with_browse(self.model, self), _with_browse(self.draft, self)
        self.local_fields = (model_row, draft_row, self.device, self.dtype, self.weights)
        form = QFormLayout()
        form.addRow("Backend", self.backend)
        form.addRow("System prompt", self.system)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k", self.top_k)
        form.addRow("Seed", self.seed)
        form.addRow(_section("Local engine"))
        form.addRow("Model", model_row)
        form.addRow("Draft model", draft_row)
        form.addRow("Device", self.device)
        form.addRow("Precision", self.dtype)
        form.addRow("GGUF weights", self.weights)
        form.addRow(_section("Remote server"))
        form.addRow(self.remote)
        note = QLabel("Changing the backend, the model, draft model, device, precision or GGUF weights, or the "
                      "server's details reloads the model or reconnects; the other settings apply to the next "
                      "message.")
        note.setWordWrap(True)
        mute(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        fields = QWidget()
        column = QVBoxLayout(fields)
        column.setContentsMargins(0, 0, 0, 0)
        column.addLayout(form)
        column.addWidget(note)
        scroll = _scrolling(fields)  # the fields scroll on screens shorter than them; OK and Cancel stay in view
        self.strategies = StrategiesPage(settings, usable)
        self.corpus = CorpusSection(str(history.corpus_folder), history.corpus_size(), history.clear_corpus) \
            if history is not None else None
        strategies = QWidget()
        page = QVBoxLayout(strategies)
        page.setContentsMargins(0, 0, 0, 0)
        page.addWidget(self.strategies)
        if self.corpus is not None:
            page.addWidget(self.corpus)
        self.tabs = QTabWidget()
        self.tabs.addTab(scroll, "General")
        self.tabs.addTab(_scrolling(strategies), "Strategies")
        scroll.setMinimumWidth(fields.sizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        available = self.screen().availableGeometry().height() if self.screen() is not None else 10**6
        scroll.setMinimumHeight(min(fields.sizeHint().height(), max(200, available - 160)))
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)
        layout.addWidget(buttons)
        self.backend.currentIndexChanged.connect(self._enable_fields)
        self._enable_fields()

    def _enable_fields(self) -> None:
        remote = self.backend.currentData() == "remote"
        for widget in self.local_fields:
            widget.setEnabled(not remote)
        self.strategies.set_local(not remote)  # the strategies' options act on this engine only
        self.remote.setEnabled(remote)

    def accept(self) -> None:
        """OK: a typed API key goes to the OS keyring first; if that fails, say why and stay open."""
        problem = self.remote.store_key()
        if problem:
            self.remote.show_problem(f"The API key was not stored: {problem}")
            return
        super().accept()

    def result_settings(self) -> Settings:
        return replace(
            self._settings,
            backend=self.backend.currentData(),
            **self.remote.values(),
            model_source=self.model.text().strip() or "bundled",
            draft_source=self.draft.text().strip(),
            device=self.device.currentText(),
            dtype=self.dtype.currentText(),
            weights=self.weights.currentText(),
            system_prompt=self.system.toPlainText(),
            top_p=self.top_p.value(),
            top_k=self.top_k.value(),
            seed=self.seed.value(),
            **self.strategies.values(),
        )


class SeedField(QLineEdit):
    """The seed: empty for a fresh one each answer, else a whole number in the engine's range (a spin box holds
    only 32 bits, and raised on a larger seed from the settings file)."""

    def __init__(self, seed: int | None) -> None:
        super().__init__("" if seed is None else str(seed))
        self.setPlaceholderText("random")
        self.setValidator(QRegularExpressionValidator(QRegularExpression(r"-?\d{0,20}"), self))
        self.setToolTip(f"Sampling: the same seed repeats an answer; empty: a fresh one each time. A whole number "
                        f"from {SEED_MIN} to {SEED_MAX} (one outside is brought within)")

    def value(self) -> int | None:
        text = self.text().strip()
        return None if text in ("", "-") else min(max(int(text), SEED_MIN), SEED_MAX)


def _scrolling(widget: QWidget) -> QScrollArea:
    scroll = QScrollArea()
    scroll.setWidget(widget)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return scroll


def needs_reload(old: Settings, new: Settings) -> bool:
    """Another backend, or another model (local) or server (remote) for the chosen one."""
    if old.backend != new.backend:
        return True
    keys = REMOTE_KEYS if new.remote else LOCAL_KEYS
    return any(getattr(old, k) != getattr(new, k) for k in keys)


def _section(title: str) -> QLabel:
    label = QLabel(f"<b>{title}</b>")
    label.setContentsMargins(0, 8, 0, 0)
    return label


def _combo(values, current: str) -> QComboBox:
    box = QComboBox()
    box.addItems(list(values))
    box.setCurrentText(current)
    return box


def _with_browse(edit: QLineEdit, parent) -> QWidget:
    def browse() -> None:
        path, _ = keyboard_back(edit, QFileDialog.getOpenFileName(  # the keyboard back to the field
            parent, "Choose a model file", start_folder("model"), "GGUF models (*.gguf);;All files (*)"))
        if chosen("model", path):
            edit.setText(path)

    button = QPushButton("Browse…")
    button.clicked.connect(browse)
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(edit, 1)
    layout.addWidget(button)
    return row
