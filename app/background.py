"""Work off the GUI thread: `run(owner, work, done, failed, progress)` calls `work` on a short-lived thread
and hands its result, its progress reports and its exception to callbacks on the GUI thread.

A window that waits on a disk or the network freezes, and a worker thread must not touch widgets: this is
the one way across for the window's one-off jobs (reading a large chat, listing models, a download, a
connection test). Every callback runs on the GUI thread, in the order the worker produced it (progress
reports before the result), and not at all once `owner`, the QObject the callbacks belong to, is deleted
(a dialog closed while a download ran). The engine's streams have their own door (`bridge.py`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, Signal, Slot

log = logging.getLogger(__name__)


class _Relay(QObject):
    """Lives on the GUI thread for the whole session and calls there what the workers hand it; it is never
    deleted, so a worker can always reach it, whatever widget closed meanwhile."""

    call = Signal(object)  # a function of no arguments, queued to the GUI thread

    def __init__(self) -> None:
        super().__init__()
        self.call.connect(self._call)

    @Slot(object)
    def _call(self, fn: Callable[[], Any]) -> None:
        fn()


_relay: _Relay | None = None


def _the_relay() -> _Relay:
    """The one relay, made on first use and kept on the application's (the GUI) thread."""
    global _relay
    if _relay is None:
        _relay = _Relay()
        app = QCoreApplication.instance()
        if app is not None:
            _relay.moveToThread(app.thread())
    return _relay


def _call_if_alive(owner: QObject, callback: Callable, args: tuple) -> None:
    """On the GUI thread: the callback, unless its owner was deleted while the work ran."""
    if shiboken6.isValid(owner):
        callback(*args)


def run(owner: QObject, work: Callable, done: Callable | None = None, failed: Callable | None = None,
        progress: Callable | None = None, name: str = "specula-background") -> threading.Thread:
    """Call `work()` on a new daemon thread; then `done(result)` or `failed(exception)` on the GUI thread.

    With `progress`, the work is called as `work(report)`, and each `report(*args)` it makes becomes
    `progress(*args)` on the GUI thread. An exception with no `failed` to take it is logged."""
    relay = _the_relay()

    def deliver(callback: Callable | None, *args) -> None:
        if callback is None or not shiboken6.isValid(relay):
            return  # the application is gone (it ended while the work ran): nobody to tell
        try:
            relay.call.emit(lambda: _call_if_alive(owner, callback, args))
        except RuntimeError:  # deleted between the check and the call, as the application ends
            pass

    def body() -> None:
        try:
            result = work(lambda *args: deliver(progress, *args)) if progress is not None else work()
        except Exception as exc:
            if failed is None:
                log.exception("%s failed", name)
            deliver(failed, exc)
            return
        deliver(done, result)

    thread = threading.Thread(target=body, name=name, daemon=True)
    thread.start()
    return thread
