"""`specula-chat`: open the desktop app, optionally send a first message, save a screenshot and exit.

    specula-chat                                   open the app on the model in the settings (bundled)
    specula-chat --model M --strategy S            choose for this run (not saved)
    specula-chat --send TEXT [--screenshot PNG] [--exit-after-reply]

Exit status with --exit-after-reply: 0 when the reply finished, 1 when it failed or the model did not
load, 2 for bad arguments or a strategy the model cannot use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="specula-chat", description="Chat with a local model and watch speculative decoding "
                     "at work.")
    parser.add_argument("--model", help="bundled, a Hub id, a local folder or a .gguf file (this run only)")
    parser.add_argument("--draft-model", help="a draft model for the draft-model strategy (this run only)")
    parser.add_argument("--strategy", help="the drafting strategy (this run only)")
    parser.add_argument("--server", metavar="URL", help="chat through this OpenAI-compatible server, e.g. vLLM "
                        "(this run only; Settings > Backend keeps one)")
    parser.add_argument("--baseline-server", metavar="URL",
                        help="with --server: the same model served without speculation, for a measured speedup")
    parser.add_argument("--max-new-tokens", type=int, help="longest answer in tokens (this run only)")
    parser.add_argument("--send", metavar="TEXT", help="send TEXT as the first message once the model is ready")
    parser.add_argument("--screenshot", metavar="PATH", type=Path, help="save a PNG of the window after the reply")
    parser.add_argument("--exit-after-reply", action="store_true", help="quit once the reply (and screenshot) is done")
    args = parser.parse_args(argv)
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be at least 1")
    if args.baseline_server is not None and args.server is None:
        parser.error("--baseline-server needs --server")
    from specula.engine.remote.http import RemoteError, normalize_url  # torch-free

    for flag, url in (("--server", args.server), ("--baseline-server", args.baseline_server)):
        if url is not None:
            try:
                normalize_url(url)
            except RemoteError as exc:
                parser.error(f"{flag}: {exc}")
    return args


def overrides_from(args: argparse.Namespace) -> dict:
    names = {"model": "model_source", "draft_model": "draft_source", "strategy": "strategy",
             "max_new_tokens": "max_new_tokens", "server": "server_url", "baseline_server": "baseline_url"}
    overrides = {field: getattr(args, arg) for arg, field in names.items() if getattr(args, arg) is not None}
    if args.server is not None:
        overrides["backend"] = "remote"
    return overrides


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from PySide6.QtWidgets import QApplication

    from specula.app.autopilot import Autopilot
    from specula.app.window import MainWindow

    _quiet_qt()
    app = QApplication.instance() or QApplication(sys.argv[:1])
    _name_the_app(app)
    window = MainWindow(overrides=overrides_from(args))
    window.show()
    pilot = Autopilot(window, args.send, args.screenshot, args.exit_after_reply)
    window.start()
    code = app.exec()
    window.close()
    result = pilot.exit_code if pilot.exit_code is not None else code
    _delete(window)
    return result


def _quiet_qt() -> None:
    """Qt's headless platform warns about a feature it lacks on every window: not the user's concern."""
    from PySide6.QtCore import QtMsgType, qInstallMessageHandler

    def handler(kind, context, message: str) -> None:
        if "propagateSizeHints" in message:
            return
        if kind != QtMsgType.QtDebugMsg:
            print(message, file=sys.stderr)

    qInstallMessageHandler(handler)


def _delete(window) -> None:
    """Destroy the window while the QApplication still exists: left to the interpreter's teardown, the
    plots' graphics view can outlive the application and crash the process on exit."""
    import shiboken6

    if shiboken6.isValid(window):
        shiboken6.delete(window)


def _name_the_app(app) -> None:
    from specula.engine.api.paths import APP_ID

    app.setApplicationName("Specula")
    app.setOrganizationName("Specula")
    app.setDesktopFileName(APP_ID)
    app.setWindowIcon(app_icon())


def app_icon():
    """The SVG icon, with the PNG beside it (a bundle copies resources/specula.png there) for where
    Qt's SVG plugin is missing."""
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for name in ("specula.svg", "specula.png"):
        path = Path(__file__).with_name("resources") / name
        if path.exists():
            icon.addFile(str(path))
    return icon


if __name__ == "__main__":
    sys.exit(main())
