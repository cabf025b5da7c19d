"""The Settings dialog's "Remote server" section: where the server is, which model, how to find the API
key, an optional baseline server and a "Test connection" button.

The key itself is never a setting: the field stores it in the OS keyring when the dialog is accepted
(or the user names an environment variable that holds it). The connection test runs on a short-lived
thread (`background.run`), so a slow or dead server never blocks the window; its answer comes back to the
GUI thread.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QWidget,
)

from specula.app import background
from specula.app.focus import keyboard_back
from specula.app.settings import Settings

BASELINE_TIP = ("Optional: the same model served without speculation, for a measured speedup (timed when "
                "connecting)")
KEY_ENV_TIP = "The name of an environment variable that holds the API key (it is read, never saved)"
NO_KEYRING_TIP = "No OS keyring is available here: put the key in an environment variable and name it above"


class RemoteSection(QWidget):
    """The remote backend's fields; `values()` gives them as Settings fields."""

    tested = Signal(bool)  # a connection test ended: connected or not

    def __init__(self, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        from specula.engine.remote.keys import keyring_available  # torch-free

        self.url = QLineEdit(settings.server_url)
        self.url.setPlaceholderText("http://127.0.0.1:8000 (an OpenAI-compatible server, e.g. vLLM)")
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.lineEdit().setPlaceholderText("the server's first model")
        self.model.setEditText(settings.server_model)
        self.key_env = QLineEdit(settings.api_key_env)
        self.key_env.setPlaceholderText("none (e.g. OPENAI_API_KEY)")
        self.key_env.setToolTip(KEY_ENV_TIP)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.keyring = keyring_available()
        if self.keyring:
            self.key.setPlaceholderText("stored in the OS keyring when you press OK (empty: unchanged)")
        else:
            self.key.setEnabled(False)
            self.key.setPlaceholderText("no OS keyring here: use an environment variable")
            self.key.setToolTip(NO_KEYRING_TIP)
        self.baseline = QLineEdit(settings.baseline_url)
        self.baseline.setPlaceholderText("optional")
        self.baseline.setToolTip(BASELINE_TIP)
        self.verify_tls = QCheckBox("Verify TLS certificates")
        self.verify_tls.setChecked(settings.verify_tls)
        self.allow_http_key = QCheckBox("Send the API key over plain http:// (unencrypted) to another host")
        self.allow_http_key.setChecked(settings.allow_http_key)
        self.allow_http_key.setToolTip("Anyone on the network path can read a key sent over http://. Leave this off "
                                       "and use https:// unless the network is yours. A server on this machine "
                                       "(localhost) never needs it.")
        self.test_button = QPushButton("Test connection")
        self.result = QLabel()
        self.result.setWordWrap(True)
        self.key_stored = False  # a key went to the keyring (the connection should be made again)
        self._tests = 0  # numbers the tests, so only the latest one's answer is shown
        self.test_button.clicked.connect(self.test_connection)
        self.allow_http_key.clicked.connect(self._confirm_http_key)
        self._layout()

    def _layout(self) -> None:
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Server URL", self.url)
        form.addRow("Model", self.model)
        form.addRow("API key variable", self.key_env)
        form.addRow("API key", self.key)
        form.addRow("Baseline server URL", self.baseline)
        form.addRow("", self.verify_tls)
        form.addRow("", self.allow_http_key)
        row = QWidget()
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(self.test_button)
        line.addWidget(self.result, 1)
        form.addRow("", row)

    def values(self) -> dict:
        """The section's Settings fields (the key is not one of them)."""
        return {"server_url": self.url.text().strip(), "server_model": self.model.currentText().strip(),
                "api_key_env": self.key_env.text().strip(), "baseline_url": self.baseline.text().strip(),
                "verify_tls": self.verify_tls.isChecked(), "allow_http_key": self.allow_http_key.isChecked()}

    def _confirm_http_key(self, checked: bool) -> None:
        """Ticking the box sends a secret in the clear: the user confirms it, naming the host, or it stays off."""
        if checked and not confirm_http_key(self, _host(self.url.text())):
            self.allow_http_key.setChecked(False)

    def store_key(self) -> str | None:
        """Put a typed key in the OS keyring; None when done (or nothing to do), else why it failed."""
        from specula.engine.remote.keys import keyring_set

        key = self.key.text().strip()
        if not key or not self.key.isEnabled():
            return None
        url = self.url.text().strip()
        if not url:
            return "Enter the server URL first: the key is stored for that server."
        try:
            keyring_set(url, key)
        except ValueError as exc:  # RemoteError: no keyring, refused, or a bad URL
            return str(exc)
        self.key.clear()
        self.key_stored = True
        return None

    def show_problem(self, message: str) -> None:
        self.result.setText(f"<span style='color:#cf222e'>{_escape(message)}</span>")

    # -- the connection test ------------------------------------------------------------------------
    def test_connection(self) -> None:
        """Probe the server on a helper thread; the answer shows in the label next to the button."""
        self._tests += 1
        self.test_button.setEnabled(False)
        self.result.setText("Connecting…")
        v, typed_key = self.values(), self.key.text().strip() if self.key.isEnabled() else ""
        args = (v["server_url"], v["server_model"], v["api_key_env"], v["verify_tls"], typed_key, v["allow_http_key"])
        number = self._tests
        background.run(self, lambda: _probe(*args), done=lambda info: self._show_answer(number, info),
                       failed=lambda exc: self._show_answer(number, str(exc) or type(exc).__name__),
                       name="specula-probe")

    def _show_answer(self, number: int, answer) -> None:
        """A test's answer, a ServerInfo or the error's message; only the latest test's is shown."""
        if number != self._tests:
            return
        self.test_button.setEnabled(True)
        if isinstance(answer, str):
            self.show_problem(answer)
            self.tested.emit(False)
            return
        typed = self.model.currentText().strip()
        self.model.clear()
        self.model.addItems(list(answer.models))
        self.model.setEditText(typed or answer.model)
        self.result.setText(connected_text(answer))
        self.tested.emit(True)


def _probe(url: str, model: str, key_env: str, verify_tls: bool, typed_key: str, allow_http_key: bool):
    """Ask the server what it is and serves (on a worker thread); a ServerInfo, or RemoteError (a ValueError)."""
    from specula.engine.remote.backend import probe, server_for
    from specula.engine.remote.http import Server

    server = server_for(url, key_env, verify_tls, allow_http_key=allow_http_key)
    if typed_key and not key_env:  # a key typed but not stored yet: test with it
        server = Server(server.url, typed_key, verify_tls, allow_http_key=allow_http_key)
    return probe(server, model)


def confirm_http_key(parent: QWidget, host: str) -> bool:
    """Ask before the API key may travel unencrypted; True when the user says yes (No is the default)."""
    where = f"to {host}" if host else "to a server that is not this machine"
    answer = QMessageBox.warning(
        parent, "Send the API key unencrypted?",
        f"With this on, the API key goes over plain http:// {where}: anyone on the network path can read it "
        "and use it.\n\nUse https:// instead unless the network is yours. Send the key unencrypted?",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
    return keyboard_back(parent.window(), answer == QMessageBox.StandardButton.Yes)  # the dialog asked from


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        return urlsplit(url.strip()).hostname or ""
    except ValueError:
        return ""


def connected_text(info) -> str:
    """e.g. "Connected: vLLM 0.32.0, 1 model, speculation counters: yes"."""
    what = f"vLLM {info.version}".strip() if info.kind == "vllm" else "OpenAI-compatible server"
    n = len(info.models)
    counters = "yes" if info.speculates else "no"
    return f"Connected: {what}, {n} model{'s' if n != 1 else ''}, speculation counters: {counters}"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
