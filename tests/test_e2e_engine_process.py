"""The real window with its real engine process (`specula serve` as a child) on the bundled model, in a
process of its own: the window's process never loads torch, its event loop is never blocked for long
while an answer streams, and a kill -9 of the engine mid-answer is survived (the window says so, keeps
the conversation and the partial answer, and answers the next message once the engine is back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent('''
    import json, os, signal, sys, time
    from pathlib import Path
    from PySide6.QtCore import QElapsedTimer, QTimer
    from PySide6.QtWidgets import QApplication
    from specula.app.history_db import ConversationDB
    from specula.app.settings import SettingsStore
    from specula.app.window import MainWindow

    home = Path(sys.argv[1])
    app = QApplication([])
    w = MainWindow(SettingsStore(home / "config"), ConversationDB(home / "conversations.db"),
                   overrides={"strategy": "prompt-lookup", "max_new_tokens": 160})
    w.show()
    clock, gaps, last = QElapsedTimer(), [], [0]
    clock.start()

    def tick():  # a timer probe: how long the event loop went without running it
        now = clock.elapsed()
        gaps.append(now - last[0])
        last[0] = now

    probe = QTimer()
    probe.timeout.connect(tick)
    replies = []
    w.chat.reply_finished.connect(lambda ok, event: replies.append((ok, type(event).__name__)))
    failures = []  # what a Failed said, for the assertion's message
    w.chat.reply_finished.connect(lambda ok, event: ok or failures.append(getattr(event, "message", "")))

    def wait(condition, seconds):
        deadline = time.time() + seconds
        while not condition():
            if time.time() > deadline:
                raise SystemExit(f"timed out; state {w.state}; transcript: {w.view.toPlainText()[-400:]}")
            app.processEvents()
            time.sleep(0.002)

    states = []
    set_state = w._set_state
    w._set_state = lambda state: (states.append(state), set_state(state))
    w.start()
    wait(lambda: w.state == "ready", 300)
    out = {"engine_pid": w.bridge.engine_pid}
    assert w.send_text("Name three colours of the rainbow.")
    wait(lambda: w.chat.reply is not None and w.chat.reply.tokens, 120)
    last[0] = clock.elapsed()
    gaps.clear()
    probe.start(5)
    wait(lambda: len(replies) == 1, 300)
    probe.stop()
    ticks = sorted(gaps[1:])
    out["max_gap_ms"] = ticks[-1] if ticks else None
    out["p99_gap_ms"] = ticks[int(0.99 * (len(ticks) - 1))] if ticks else None
    out["first"] = replies[0]

    assert w.send_text("Write a long story about a lighthouse keeper and the sea.")
    wait(lambda: w.chat.reply is not None and len(w.chat.reply.tokens) >= 5, 120)
    killed_at = len(states)
    os.kill(w.bridge.engine_pid, signal.SIGKILL)
    wait(lambda: len(replies) == 2, 60)
    out["killed"] = replies[1]
    out["transcript_after_kill"] = w.view.toPlainText()[-600:]
    wait(lambda: w.bridge.engine_pid not in (None, out["engine_pid"]) and w.state == "ready", 120)
    assert w.send_text("Say hello.")
    wait(lambda: len(replies) == 3, 300)
    out["after_restart"] = replies[2]
    out["failures"] = failures
    out["restarts"] = w.bridge.restarts
    out["states_after_kill"] = states[killed_at:]
    out["conversation"] = [t.role for t in w.chat.current.turns]
    out["torch_loaded"] = "torch" in sys.modules
    child = w.bridge.engine_pid
    w.close()
    time.sleep(1.0)
    try:
        os.kill(child, 0)
        out["child_alive_after_close"] = True
    except OSError:
        out["child_alive_after_close"] = False
    print("RESULT " + json.dumps(out))
''')


def test_the_window_streams_from_its_engine_process_survives_its_death_and_never_loads_torch(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "SPECULA_CONFIG_DIR": str(tmp_path / "config"),
           "SPECULA_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["first"] == [True, "Finished"]
    assert not out["torch_loaded"]  # the window's process talked to the engine only over HTTP
    # the window's event loop while the answer streamed: 99% of the timer's ticks within 100 ms, and no
    # stall at all past 150 ms (this machine shares its two cores with the engine's threads, which can
    # stretch a paint now and then; worst gaps measured here 36-80 ms, 99th percentiles 25 ms on a quiet
    # machine and 54 ms with another job running; an event loop that waits on decoding stalls for seconds)
    print(f"event loop: worst gap {out['max_gap_ms']} ms, 99th percentile {out['p99_gap_ms']} ms")
    assert out["p99_gap_ms"] is not None and out["p99_gap_ms"] <= 100, out
    assert out["max_gap_ms"] <= 150, out
    assert out["killed"] == [False, "Failed"]
    assert "engine process stopped" in out["transcript_after_kill"]
    assert "interrupted" in out["transcript_after_kill"]  # the partial answer is kept, marked
    assert out["after_restart"] == [True, "Finished"] and out["restarts"] == 1
    after = out["states_after_kill"]  # not "ready" while the new engine loads the model (it said ready)
    assert "loading" in after and after.index("loading") < len(after) - 1 - after[::-1].index("ready"), after
    assert out["conversation"].count("user") == 3 and out["conversation"].count("assistant") == 3
    assert not out["child_alive_after_close"]
