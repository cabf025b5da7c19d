"""The "Train a draft head" dialog: the loaded model answers built-in prompts, a small head learns to
guess its next tokens from those answers, and the new strategy (eagle or medusa) appears in the
toolbar. The work runs in the engine process (a TrainRequest); this dialog only shows its
progress and can cancel it. A cancelled run keeps its answers, and the next run continues from them."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from specula.engine.api.events import Failed, Loaded, Trained, Training  # plain dataclasses: no torch

KINDS = (
    ("eagle", "EAGLE: one decoder layer over the model's features (drafts best)"),
    ("eagle3", "EAGLE-3: reads three of the model's layers, trained as it drafts (for eagle; slower to train)"),
    ("medusa", "Medusa: a few light heads that guess several tokens at once"),
)
INTRO = ("Specula teaches a small head to guess this model's next tokens from the model's own answers to "
         "built-in prompts. It runs on this machine and chat waits until it ends. Cancelling keeps the "
         "answers made so far; the next run continues from them.")


class TrainDialog(QDialog):
    use_requested = Signal(str)  # the strategy to switch to

    def __init__(self, bridge, model_name: str, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Train a draft head")
        self.setMinimumWidth(560)
        self.setModal(True)  # chat waits while the engine trains
        self.bridge = bridge
        self.request_id: int | None = None
        self.trained_kind: str | None = None
        intro = QLabel(f"<b>{model_name}</b><br>{INTRO}")
        intro.setWordWrap(True)
        self.kind = QComboBox()
        for name, text in KINDS:
            self.kind.addItem(text, name)
        self.tokens = QSpinBox(minimum=1000, maximum=2_000_000, singleStep=10_000, value=40_000)
        self.tokens.setSuffix(" tokens")
        self.tokens.setToolTip("How many answer tokens the model writes for training: more drafts better and takes longer")
        self.epochs = QSpinBox(minimum=1, maximum=20, value=3)
        form = QFormLayout()
        form.addRow("Head", self.kind)
        form.addRow("Training answers", self.tokens)
        form.addRow("Epochs", self.epochs)
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)  # busy: the steps report their own eta
        self.progress.hide()
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.start_button = QPushButton("Start")
        self.start_button.setDefault(True)
        self.cancel_button = QPushButton("Cancel training")
        self.cancel_button.hide()
        self.use_button = QPushButton("Use it now")
        self.use_button.hide()
        self.close_button = QPushButton("Close")
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        for b in (self.start_button, self.cancel_button, self.use_button, self.close_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addLayout(form)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)
        self.start_button.clicked.connect(self.start)
        self.cancel_button.clicked.connect(self.cancel)
        self.use_button.clicked.connect(self._use)
        self.close_button.clicked.connect(self.close)
        bridge.event.connect(self.on_event)

    @property
    def running(self) -> bool:
        return self.request_id is not None

    def start(self) -> None:
        from specula.engine.api.types import TrainRequest

        kind = self.kind.currentData()
        self.request_id = self.bridge.train(TrainRequest(kind, tokens=self.tokens.value(), epochs=self.epochs.value()))
        self.trained_kind = None
        self._set_running(True)
        self.status.setText("Starting…")

    def cancel(self) -> None:
        if self.running:
            self.bridge.cancel(self.request_id)
            self.status.setText("Cancelling after the current batch…")
            self.cancel_button.setEnabled(False)

    def _set_running(self, running: bool) -> None:
        for w in (self.kind, self.tokens, self.epochs, self.start_button):
            w.setEnabled(not running)
        self.progress.setVisible(running)
        self.cancel_button.setVisible(running)
        self.cancel_button.setEnabled(running)
        self.use_button.hide()
        self.start_button.setText("Train again" if not running and self.trained_kind else "Start")

    def owns(self, event) -> bool:
        return self.running and event.request_id == self.request_id

    def on_event(self, event) -> None:
        if not self.owns(event):
            return
        match event:
            case Training(message=message) if message:
                self.status.setText(message[0].upper() + message[1:])
            case Trained():
                self.trained_kind = event.kind
                self.status.setText(f"Done. Held-out mean accepted length {event.accepted:.2f} tokens per step. "
                                    f"The “{event.kind}” strategy is now in the toolbar.\n{event.summary}")
            case Loaded() | Failed():
                self.request_id = None
                self._set_running(False)
                if isinstance(event, Failed):
                    self.status.setText(event.message[0].upper() + event.message[1:])
                elif self.trained_kind:
                    self.use_button.show()

    def _use(self) -> None:
        if self.trained_kind:
            self.use_requested.emit(self.trained_kind)
        self.accept()

    def closeEvent(self, event) -> None:
        self.cancel()  # closing the dialog stops the run (its answers stay for the next one)
        super().closeEvent(event)
