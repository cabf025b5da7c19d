"""Fixtures for the desktop app: a Session around tiny random models (no download, fast on a CPU) and a
main window driving it through the real Worker thread."""

from __future__ import annotations

import pytest


class ChatTokenizer:
    """Enough of a tokenizer for the app: a chat template that records the turns it was given, ids
    from characters, and text from ids (letters and spaces, so the transcript wraps)."""

    chat_template = "fake"
    alphabet = " abcdefghijklmnopqrstuvwxyz"

    def __init__(self) -> None:
        self.conversations: list[list[dict]] = []

    def apply_chat_template(self, turns, add_generation_prompt=True, tokenize=False):
        self.conversations.append(list(turns))
        return "".join(f"[{t['role']}]{t['content']}" for t in turns) + "[assistant]"

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 64 for c in text] or [0]

    def decode(self, ids, **kwargs):
        return "".join(self.alphabet[i % len(self.alphabet)] for i in ids)

    def get_vocab(self):
        return {f"t{i}": i for i in range(64)}


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """One intra-op thread while these tests run: the tiny models gain nothing from more, and on a small
    machine that is busy with other work two spinning threads can make each forward 100x slower."""
    from tests.support.tiny import one_torch_thread

    with one_torch_thread():
        yield


@pytest.fixture(scope="session")
def tiny_models():
    from tests.support.tiny import perturbed, tiny_model

    target = tiny_model(vocab=64, seed=2)
    return target, perturbed(target, scale=0.05)


@pytest.fixture()
def tiny_session(tiny_models):
    """A Session whose `load` adopts the tiny models (the draft is a perturbed copy of the target)."""
    from specula.engine.api.events import BaselineCost
    from specula.engine.serving.session import Session
    from tests.support.tiny import loaded

    target_model, draft_model = tiny_models
    session = Session()
    target = loaded(target_model)
    target.tokenizer = ChatTokenizer()

    def load(request, progress=None):
        if progress:
            progress("loading the tiny test model")
        session.use(target, loaded(draft_model))
        session.baseline = BaselineCost(0.004, 1e-5)
        if getattr(request, "draft_head", None):  # as Session.load: the head first among its kind, or left out
            session.take_head(request.draft_head)
        return session.describe()

    session.load = load
    return session


def saved_history(tmp_path):
    """The conversations database the test windows use."""
    from specula.app.history_db import ConversationDB

    return ConversationDB(tmp_path / "history" / "conversations.db")


@pytest.fixture()
def make_window(qtbot, tmp_path, tiny_session):
    """make_window(**overrides) -> a shown MainWindow whose tiny model is loaded and ready."""
    from specula.app.bridge import EngineBridge
    from specula.app.settings import SettingsStore
    from specula.app.window import MainWindow
    from tests.support.engines import ThreadEngine

    windows = []

    def make(**overrides):
        w = MainWindow(SettingsStore(tmp_path / "config"), saved_history(tmp_path),
                       EngineBridge(engine=lambda: ThreadEngine(tiny_session)), overrides=overrides)
        qtbot.addWidget(w)
        w.show()
        w.start()
        qtbot.waitUntil(lambda: w.state == "ready", timeout=60_000)
        windows.append(w)
        return w

    yield make
    for w in windows:
        w.close()


def wait_reply(qtbot, window, timeout=60_000):
    """Wait for the current reply to end; returns (ok, Finished or Failed)."""
    with qtbot.waitSignal(window.chat.reply_finished, timeout=timeout) as blocker:
        pass
    return blocker.args


def action_links(view) -> list[tuple[str, int, int]]:
    """(action name, item index, document position) of every action link in the transcript."""
    from specula.app import actions

    out = []
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            parsed = actions.parse(fragment.charFormat().anchorHref()) if fragment.isValid() else None
            if parsed:
                out.append((*parsed, fragment.position() + fragment.length() // 2))
            it += 1
        block = block.next()
    return out


def click_link(qtbot, view, name: str, which: int = -1) -> int:
    """Click an action link (the last one of that name unless told) as a user would; returns its item."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextCursor

    links = [link for link in action_links(view) if link[0] == name]
    assert links, f"no {name} link in the transcript"
    _, index, position = links[which]
    cursor = QTextCursor(view.document())
    cursor.setPosition(position)
    view.setTextCursor(cursor)
    view.ensureCursorVisible()
    after = QTextCursor(view.document())
    after.setPosition(position + 1)
    point = view.cursorRect(cursor).center()
    point.setX((point.x() + view.cursorRect(after).center().x()) // 2)  # the middle of its first character
    assert view.anchorAt(point).startswith("act:")
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=point)
    return index


def snap(widget, name: str) -> None:
    """Save a PNG of a widget to $SPECULA_SHOTS/<name>.png when that variable is set (to look at it)."""
    import os

    folder = os.environ.get("SPECULA_SHOTS")
    if folder:
        os.makedirs(folder, exist_ok=True)
        widget.grab().save(os.path.join(folder, f"{name}.png"), "PNG")


def hold_after_step(session, step: int = 3):
    """Make the worker pause after the given step of the next generations until `release` is set.
    Returns (hold, release): `hold` is set once the worker is paused."""
    import threading

    hold, release = threading.Event(), threading.Event()
    generate = session.generate

    def held(*args, **kwargs):
        for event in generate(*args, **kwargs):
            yield event
            if type(event).__name__ == "Step" and event.step == step:
                hold.set()
                release.wait(30)

    session.generate = held
    return hold, release


def load_without_draft(session) -> None:
    """Loads through this session report no draft model (so draft-model is unavailable)."""
    load = session.load

    def without_draft(request, progress=None):
        load(request, progress)
        session.draft = None
        return session.describe()

    session.load = without_draft
