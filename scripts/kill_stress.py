"""Kill a writer of the conversations database with SIGKILL at random moments, ROUNDS times, and check
after each kill that the database opens, passes SQLite's integrity check, and holds every message whose
save had returned before the kill (the writer says so on stdout after each save). The writer saves as
the app does: a user message, an answer in progress written every few milliseconds, the finished answer.

    .venv/bin/python scripts/kill_stress.py --rounds 20 --db /tmp/kill-stress.db
"""

from __future__ import annotations

import argparse
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from specula.app.history import Conversation, TokenRecord, Turn
    from specula.app.history_db import ConversationDB
    db = ConversationDB({db!r})
    found, _ = db.load_all()
    conv = found[0] if found else Conversation("stress", "Stress")
    n = len(conv.turns)
    while True:
        conv = conv.with_turn(Turn("user", f"message {{n}}"))
        db.save(conv)
        print(f"user {{n}}", flush=True)
        db.begin_answer(conv)
        text = ""
        for i in range(20):
            text += f"w{{i}} "
            db.update_answer(conv, text)
        tokens = tuple(TokenRecord(f"w{{i}} ", "draft", i, 0) for i in range(20))
        conv = conv.with_turn(Turn("assistant", text, tokens))
        db.save(conv)
        print(f"answer {{n + 1}}", flush=True)
        n += 2
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--db", type=Path, default=Path("/tmp/kill-stress.db"))
    args = parser.parse_args()
    for path in (args.db, Path(f"{args.db}-wal"), Path(f"{args.db}-shm")):
        path.unlink(missing_ok=True)
    sys.path.insert(0, str(ROOT))
    from specula.app.history_db import ConversationDB

    saved_total = 0
    for round_ in range(1, args.rounds + 1):
        writer = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), db=str(args.db))],
                                  stdout=subprocess.PIPE, text=True)
        time.sleep(random.uniform(0.8, 2.0))  # the import takes about half a second; then it writes
        writer.send_signal(signal.SIGKILL)
        out, _ = writer.communicate()
        saved = [(kind, int(n)) for kind, n in (line.split() for line in out.splitlines())]
        check = sqlite3.connect(args.db).execute("PRAGMA integrity_check").fetchone()[0]
        (conv,), notices = ConversationDB(args.db).load_all()
        turns = conv.turns
        missing = [(kind, n) for kind, n in saved if not (
            n < len(turns) and (turns[n].content == f"message {n}" if kind == "user"
                                else turns[n].role == "assistant" and not turns[n].interrupted))]
        ok = check == "ok" and not missing
        interrupted = sum(t.interrupted for t in conv.turns)
        print(f"round {round_}: {len(saved)} saves before the kill, {len(turns)} turns, integrity {check}, "
              f"{interrupted} interrupted answers kept{'' if ok else ', MISSING: ' + str(missing)}")
        if not ok:
            return 1
        saved_total += len(saved)
    print(f"{args.rounds} kills, {saved_total} saves before them: every one is there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
