"""Kill the desktop app with SIGKILL while it saves and while it streams an answer, ROUNDS times, and check
after each kill that the conversations database opens, passes SQLite's integrity check and holds every
message that was in it just before the kill (an answer cut short is kept, marked interrupted).

Each round starts the real app (headless) on the bundled model with a new message; the script watches
the database from outside and kills the app either the moment the message lands (the save of the user
turn and the start of the answer) or at a random moment while the answer streams. A last round lets the
app answer in full, to show it still opens and works on the database the kills left.

    .venv/bin/python scripts/app_kill_stress.py --rounds 20 --data /tmp/app-kill-stress
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.02
START_LIMIT_S = 120  # the model load and the first save must come by then


def rows(db: Path) -> list[tuple]:
    """Every turn in the database, read as another process would (read-only, through the WAL)."""
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute("SELECT conversation, idx, role, content, state FROM turns "
                           "ORDER BY conversation, idx").fetchall()
    except sqlite3.OperationalError:  # the app has not made its tables yet
        return []
    finally:
        con.close()


def start(data: Path, text: str, max_new_tokens: int) -> subprocess.Popen:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "SPECULA_DATA_DIR": str(data),
           "HOME": str(data / "home"), "XDG_CONFIG_HOME": str(data / "config")}
    return subprocess.Popen([sys.executable, "-m", "specula.app.main", "--send", text, "--max-new-tokens",
                             str(max_new_tokens), "--exit-after-reply"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_for(app: subprocess.Popen, db: Path, text: str, streaming: bool) -> list[tuple] | None:
    """Poll until `text` is saved (and, with `streaming`, an answer to it has begun); the rows then."""
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline and app.poll() is None:
        now = rows(db)
        user = [r for r in now if r[2] == "user" and r[3] == text]
        if user and (not streaming or any(r[0] == user[0][0] and r[1] == user[0][1] + 1 for r in now)):
            return now
        time.sleep(POLL_S)
    return None


def check(db: Path, before: list[tuple]) -> list[str]:
    """What is wrong with the database after a kill, compared with the rows seen just before it."""
    sys.path.insert(0, str(ROOT))
    from specula.app.history_db import ConversationDB

    con = sqlite3.connect(db)
    integrity = con.execute("PRAGMA integrity_check").fetchone()[0]
    con.close()
    problems = [] if integrity == "ok" else [f"integrity check: {integrity}"]
    store = ConversationDB(db)
    listed, _ = store.list_all()  # marks answers cut by the kill as interrupted, as the app's start does
    after = {(c.id, i): t for c in listed for i, t in enumerate(store.load(c.id).turns)}
    store.close()
    for conversation, idx, role, content, state in before:
        turn = after.get((conversation, idx))
        if turn is None or turn.role != role:
            problems.append(f"missing: {role} turn {idx} of {conversation}")
        elif state == "streaming":
            if not (turn.interrupted and turn.content.startswith(content)):
                problems.append(f"the answer in progress at turn {idx} was not kept as interrupted")
        elif turn.content != content:
            problems.append(f"changed: {role} turn {idx} of {conversation}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--data", type=Path, default=Path("/tmp/app-kill-stress"))
    parser.add_argument("--max-new-tokens", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    random.seed(args.seed)
    shutil.rmtree(args.data, ignore_errors=True)
    args.data.mkdir(parents=True)
    db = args.data / "conversations.db"
    kept = 0
    for round_ in range(1, args.rounds + 1):
        text = f"Round {round_}: tell me a long story about a lighthouse keeper."
        during_save = round_ % 2 == 1
        app = start(args.data, text, args.max_new_tokens)
        seen = wait_for(app, db, text, streaming=not during_save)
        if seen is None:
            app.kill()
            print(f"round {round_}: the app did not save the message: {app.communicate()[1].strip()[-300:]}")
            return 1
        if not during_save:
            time.sleep(random.uniform(0.2, 6.0))
        before = rows(db)
        app.send_signal(signal.SIGKILL)
        app.communicate()
        problems = check(db, before)
        moment = "as the message was saved" if during_save else "while the answer streamed"
        streaming = sum(r[4] == "streaming" for r in before)
        print(f"round {round_}: killed {moment}; {len(before)} turns before, {streaming} answer in progress"
              f"{'' if not problems else '; ' + '; '.join(problems)}", flush=True)
        if problems:
            return 1
        kept += len(before)
    app = start(args.data, "After the kills: say hello.", 16)
    _, err = app.communicate(timeout=300)
    if app.returncode != 0:
        print(f"the app did not answer after the kills (exit {app.returncode}): {err.strip()[-300:]}")
        return 1
    print(f"{args.rounds} kills: every turn seen before each ({kept} in all) was there after it; "
          "the app then opened the database and answered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
