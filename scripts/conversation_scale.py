"""How the conversation store and the transcript scale: build a conversation of TURNS turns (half of them
200-token answers with their token records), then time opening the database, appending one message and
drawing the conversation in the transcript.

    .venv/bin/python scripts/conversation_scale.py --turns 2400 --db /tmp/big.db
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def build(path: Path, turns: int) -> None:
    from app.history import Conversation, TokenRecord, Turn
    from app.history_db import ConversationDB

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
    from PySide6.QtWidgets import QApplication

    from app.chatview import ChatView
    from app.history import Turn
    from app.history_db import ConversationDB

    print(f"database: {args.db.stat().st_size / 1e6:.1f} MB")
    t = time.perf_counter()
    db = ConversationDB(args.db)
    (conv,), _ = db.load_all()
    print(f"open the database and read it: {time.perf_counter() - t:.2f} s ({len(conv.turns)} turns)")
    t = time.perf_counter()
    db.save(conv.with_turn(Turn("user", "one more")))
    print(f"append a message: {(time.perf_counter() - t) * 1000:.1f} ms")
    app = QApplication([])
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
