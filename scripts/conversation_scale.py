"""How the conversation store and the transcript scale: build a conversation of TURNS turns (half of them
200-token answers with their token records), then time reading it in a thread while an event loop ticks
every 10 ms (the longest wait of the loop is what the window would feel), appending one message and
drawing the conversation in the transcript.

    .venv/bin/python scripts/conversation_scale.py --turns 2400 --db /tmp/big.db
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path


def build(path: Path, turns: int) -> None:
    from specula.app.history import Conversation, TokenRecord, Turn
    from specula.app.history_db import ConversationDB

    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do".split() * 20
    tokens = tuple(TokenRecord(w + " ", "draft" if j % 3 else "target", j, 0, 0.91, 0.83) for j, w in enumerate(words))
    conv = Conversation("big", "A long conversation")
    for i in range(turns // 2):
        conv = conv.with_turn(Turn("user", f"question {i} " * 20))
        conv = conv.with_turn(Turn("assistant", " ".join(words), tokens, "prompt-lookup · 200 tokens"))
    db = ConversationDB(path)
    db.save(conv)
    db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2400)
    parser.add_argument("--db", type=Path, default=Path("/tmp/specula-scale.db"))
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    if not args.db.exists():
        build(args.db, args.turns)
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication

    from specula.app.chatview import ChatView
    from specula.app.history import Turn
    from specula.app.history_db import ConversationDB

    print(f"database: {args.db.stat().st_size / 1e6:.1f} MB")
    app = QApplication([])
    read, ticks = [], [time.perf_counter()]
    gaps: list[float] = []

    def tick() -> None:
        now = time.perf_counter()
        gaps.append(now - ticks[-1])
        ticks.append(now)
        if read:
            app.quit()

    def reader() -> None:
        t = time.perf_counter()
        read.append((ConversationDB(args.db).load("big"), time.perf_counter() - t))

    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(tick)
    timer.start()
    threading.Thread(target=reader).start()
    app.exec()
    timer.stop()
    conv, seconds = read[0]
    print(f"read it in a thread: {seconds:.2f} s ({len(conv.turns)} turns); the event loop's longest wait meanwhile: "
          f"{max(gaps) * 1000:.0f} ms")
    db = ConversationDB(args.db)
    db.adopt(conv)
    t = time.perf_counter()
    db.save(conv.with_turn(Turn("user", "one more")))
    print(f"append a message: {(time.perf_counter() - t) * 1000:.1f} ms")
    view = ChatView()
    view.resize(900, 700)
    view.show()
    t = time.perf_counter()
    view.show_turns(conv.turns)
    app.processEvents()
    print(f"draw it in the transcript: {(time.perf_counter() - t) * 1000:.0f} ms ({len(conv.turns) - view._first} turns drawn)")
    t = time.perf_counter()
    view.show_earlier()
    app.processEvents()
    print(f"show earlier messages: {(time.perf_counter() - t) * 1000:.0f} ms ({len(conv.turns) - view._first} turns drawn)")


if __name__ == "__main__":
    main()
