"""The Models view end to end on the real engine: a tiny random model (with the bundled tokenizer) downloaded
from a local stand-in for the Hugging Face Hub with visible progress, cancelled a third of the way, resumed
(a Range request), loaded from the view and chatted with. Screenshots go to --shots.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/models_e2e.py --shots /tmp/models-e2e
"""
import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--shots", type=Path, default=Path(tempfile.gettempdir()) / "models-e2e")
SHOTS = parser.parse_args().shots
SHOTS.mkdir(parents=True, exist_ok=True)
work = Path(tempfile.mkdtemp(prefix="models-e2e-"))
repo_dir = work / "served"
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specula.engine.api.types import ModelChoice
from specula.engine.models.loading import load_model

tok = load_model(ModelChoice("bundled", device="cpu", dtype="fp32")).tokenizer
cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=512, eos_token_id=2, torch_dtype="float32")
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained(repo_dir)
tok.save_pretrained(repo_dir)
files = {p.name: p.read_bytes() for p in repo_dir.iterdir() if p.is_file()}
from tests.support.fake_hub import FakeHub

hub = FakeHub({"tiny-org/tiny-chat": files}).__enter__()
hub.pause_s = 0.03
os.environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(work / "hf"), HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
                  SPECULA_DATA_DIR=str(work / "data"), HOME=str(work / "home"))
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

app = QApplication(sys.argv[:1])
from specula.app.window import MainWindow

w = MainWindow(overrides={"max_new_tokens": 24})
w.show(); w.resize(1280, 800)
state = {"phase": "start"}
def shot(name, widget=None):
    (widget or w).grab().save(str(SHOTS / f"{name}.png"), "PNG")
    print("shot", SHOTS / f"{name}.png", flush=True)
def also_after(view, name, also):
    """`also(*args)` runs after the view's method `name` ran with them (the view reports on the GUI thread)."""
    method = getattr(type(view), name)
    setattr(view, name, lambda *args: (method(view, *args), also(*args)))
def on_ready():
    if state["phase"] == "start":
        state["phase"] = "download"
        w.open_models(); v = w.models_view; v.resize(900, 500)
        v.hub_id.setText("tiny-org/tiny-chat")
        def progress(done, total):
            if state["phase"] == "download" and done > total // 3:
                state["phase"] = "cancelling"; shot("progress", v); v.cancel_download()
        also_after(v, "_show_progress", progress)
        also_after(v, "_downloaded", downloaded)
        also_after(v, "_download_failed", downloaded)  # a cancel ends here
        QTimer.singleShot(500, lambda: v.download_button.click())
    elif state["phase"] == "using":
        state["phase"] = "chat"
        print("loaded", w.loaded.target, "settings", w.settings.model_source, flush=True)
        w.models_view.close()
        w.send_text("hello there")
def downloaded(result, repo):
    v = w.models_view
    print("downloaded:", v.progress_text.text(), "ranges", hub.ranges("model.safetensors"), flush=True)
    if state["phase"] == "cancelling":
        shot("cancelled", v); state["phase"] = "resume"; hub.pause_s = 0.0
        QTimer.singleShot(300, lambda: v.download_button.click())
    elif state["phase"] == "resume":
        state["phase"] = "listing"
        QTimer.singleShot(3000, use)
def use():
    v = w.models_view
    shot("listed", v)
    print("selected", v.selected() and v.selected().source, flush=True)
    state["phase"] = "using"; v.use_button.click()
def replied(ok, event):
    print("reply ok", ok, repr(getattr(event, "text", ""))[:80], getattr(event, "message", ""), flush=True)
    QTimer.singleShot(300, lambda: (shot("chatted"), app.exit(0 if ok else 1)))
w.model_ready.connect(on_ready)
w.model_failed.connect(lambda m: (print("FAILED", m, flush=True), app.exit(2)))
w.chat.reply_finished.connect(replied)
w.start()
code = app.exec()
saved = "tiny-org/tiny-chat" in w.settings_store.path.read_text()
print(f"exit {code}; the downloaded model saved as the one to use: {saved}", flush=True)
os._exit(code if saved else 1)
