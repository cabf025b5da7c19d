"""What `specula-chat --send ... --screenshot ... --exit-after-reply` does once the window is up:
send the message when the model is ready, save a PNG of the whole window after the reply, then quit
with a status that says whether it worked."""

from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

SETTLE_MS = 150  # let the final repaint land before grabbing


class Autopilot(QObject):
    def __init__(self, window, send: str | None, screenshot: Path | None, exit_after: bool, quit=None) -> None:
        super().__init__(window)
        self.window, self.text, self.screenshot, self.exit_after = window, send, screenshot, exit_after
        self._exit = quit or QApplication.instance().exit  # tests pass their own
        self.exit_code: int | None = None
        self.asked = dict(window.overrides)  # what the command line chose (the window changes its overrides)
        window.model_ready.connect(self._ready)
        window.model_failed.connect(self._load_failed)
        window.chat.reply_finished.connect(self._replied)
        if exit_after:  # nobody looks at the window: what its banners say goes to stderr too
            for message in window.notices.messages:
                print(f"specula-chat: note: {message}", file=sys.stderr)
            said = set(window.notices.messages)

            def say(message: str) -> None:  # each problem once, however often a save is retried
                if message not in said and not any(message in m for m in said):
                    said.add(message)
                    print(f"specula-chat: {message}", file=sys.stderr)

            window.chat.store_failed.connect(say)

    def _ready(self) -> None:
        if self.text is None:
            return
        text, self.text = self.text, None  # only the first time the model is ready
        unavailable = self.window.strategy_unavailable
        if unavailable and self.exit_after and "strategy" in self.asked:  # asked for on the command line: an error
            print(f"specula-chat: strategy '{unavailable}' is not available for this model", file=sys.stderr)
            self._quit(2)
            return
        if unavailable and self.exit_after:  # a saved choice: the window took another, as it says
            print(f"specula-chat: note: the saved strategy '{unavailable}' is not available for this model; using "
                  f"'{self.window.settings.strategy}'", file=sys.stderr)
        if not self.window.send_text(text):
            print("specula-chat: could not send the message", file=sys.stderr)
            self._done(1)

    def _load_failed(self, message: str) -> None:
        if self.window.falling_back and "model_source" not in self.asked and self.text is not None:
            # a saved model that does not load: the window goes on with the bundled one, and so does the message
            print(f"specula-chat: note: the saved model could not be loaded ({message}); using the bundled model",
                  file=sys.stderr)
            return
        print(f"specula-chat: the model could not be loaded: {message}", file=sys.stderr)
        if self.exit_after:
            self._done(1)

    def _replied(self, ok: bool, event) -> None:
        if not ok:
            print(f"specula-chat: the reply failed: {event.message}", file=sys.stderr)
        self._done(0 if ok else 1)

    def _done(self, code: int) -> None:
        QTimer.singleShot(SETTLE_MS, lambda: self._finish(code))

    def _finish(self, code: int) -> None:
        if self.screenshot is not None:
            self.screenshot.parent.mkdir(parents=True, exist_ok=True)
            if not self.window.grab().save(str(self.screenshot), "PNG"):
                print(f"specula-chat: could not save {self.screenshot}", file=sys.stderr)
                code = code or 1
            self.screenshot = None
        if self.exit_after:
            if self.window.chat.unsaved and code == 0:
                print("specula-chat: the conversation could not be saved (see above)", file=sys.stderr)
                code = 1
            self._quit(code)

    def _quit(self, code: int) -> None:
        self.exit_code = code
        self._exit(code)
