"""Screenshots of the real window (its engine process, the bundled model) on a real X display, as a new user
sees it: an answer, the dock's figures with a tooltip, a Compare, a long prompt being read, and the Hub's
search in the Models view (against a local stand-in for the Hub). Run under Xvfb at the screen size to look at:

    xvfb-run -a -s "-screen 0 1024x700x24" .venv/bin/python scripts/screens.py --out DIR --theme dark --tour

Each PNG is the whole screen (tooltips and the Models window included), named SIZE-THEME-WHAT.png.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the Hub's stand-in

LONG_PROMPT = "Summarize the following text in three sentences.\n\n"
QUESTION = "Rewrite this function with type hints and a docstring:\n\ndef add(a, b):\n    return a + b"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--theme", default="light", choices=("light", "dark", "system"))
    parser.add_argument("--tour", action="store_true", help="also Compare, a long prompt and the Hub search")
    parser.add_argument("--strategy", default="auto")
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb")

    from PySide6.QtWidgets import QApplication, QToolTip

    from specula.app.history_db import ConversationDB
    from specula.app.settings import SettingsStore
    from specula.app.window import MainWindow
    from tests.support.fake_hub import FakeHub

    repos = {"HuggingFaceTB/SmolLM2-360M-Instruct": {"config.json": b"{}", "model.safetensors": b"\0" * 4096},
             "HuggingFaceTB/SmolLM2-1.7B-Instruct": {"config.json": b"{}", "model.safetensors": b"\0" * 8192},
             "bartowski/SmolLM2-1.7B-Instruct-GGUF": {f"SmolLM2-1.7B-Instruct-{q}.gguf": b"\0" * 2048
                                                      for q in ("Q4_K_M", "Q5_K_M", "Q8_0")}}
    hub = FakeHub(repos)
    hub.downloads = {"HuggingFaceTB/SmolLM2-1.7B-Instruct": 61_204, "bartowski/SmolLM2-1.7B-Instruct-GGUF": 9_871,
                     "HuggingFaceTB/SmolLM2-360M-Instruct": 120_355}
    hub.tags = {"bartowski/SmolLM2-1.7B-Instruct-GGUF": ["gguf"]}
    app = QApplication([])
    screen = app.primaryScreen()
    size = f"{screen.size().width()}x{screen.size().height()}"
    args.out.mkdir(parents=True, exist_ok=True)

    def pump(seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            app.processEvents()
            time.sleep(0.01)

    def wait(condition, seconds: float, what: str) -> None:
        deadline = time.time() + seconds
        while not condition():
            if time.time() > deadline:
                raise SystemExit(f"screens: timed out waiting for {what}")
            pump(0.05)

    def shot(name: str) -> None:
        pump(0.4)  # the last repaint, a tooltip's fade-in
        path = args.out / f"{size}-{args.theme}-{name}.png"
        screen.grabWindow(0).save(str(path), "PNG")
        print(path)

    with hub, tempfile.TemporaryDirectory() as home:
        os.environ["HF_ENDPOINT"] = hub.url
        home = Path(home)
        w = MainWindow(SettingsStore(home / "config"), ConversationDB(home / "conversations.db"),
                       overrides={"strategy": args.strategy, "max_new_tokens": 96})
        w.set_theme(args.theme)
        w.show()
        w.start()
        wait(lambda: w.state == "ready", 600, "the model")
        replies = []
        w.chat.reply_finished.connect(lambda ok, event: replies.append(ok))
        w.send_text(QUESTION)
        wait(lambda: replies, 300, "the answer")
        shot("answer")
        label = w.plots.stat_labels["speedup"]
        QToolTip.showText(label.mapToGlobal(label.rect().bottomLeft()), label.toolTip(), label)
        shot("speedup-tooltip")
        QToolTip.hideText()
        if not args.tour:
            return
        done = []
        w.compare.finished.connect(done.append)
        w.compare_last()
        wait(lambda: done, 600, "the comparison")
        shot("compare")
        reading = []
        w.chat.reading.connect(lambda text: reading.append(text) if text else None)
        text = (ROOT / "docs" / "ENGINE.md").read_text(encoding="utf-8")[:14_000]
        w.send_text(LONG_PROMPT + text)
        wait(lambda: reading or len(replies) == 2, 300, "the long prompt's progress")
        pump(1.5)
        shot("prompt-progress")
        w.chat.stop()
        wait(lambda: len(replies) == 2, 120, "the stopped answer")
        w.open_models()
        view = w.models_view
        view.search_text.setText("SmolLM2")
        view.search()
        wait(lambda: view.results.rowCount() == 3, 60, "the Hub's results")
        view.results.selectRow(2)  # the GGUF repository: its quantizations
        wait(lambda: "model file" in view.details.text(), 60, "a result's files")
        shot("hub-search")
        view.close()
        w.close()


if __name__ == "__main__":
    main()
