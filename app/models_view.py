"""File > Models…: the models on this machine and getting more, as a desktop chat app offers them.

- The list: the bundled model, the folders and GGUF files the user added, and the Hugging Face cache, each
  with its size, architecture, context length and precision or quantization, and for the loaded model which
  of them can draft for it (same vocabulary, checked from the tokenizers, not guessed from names).
- Use one (it is saved as the model to use only once it loaded), make one the draft in one click, add a
  folder or a GGUF file, remove a model from the cache.
- Download by Hub id or from the recommended list (a GGUF repository asks which file, i.e. which
  quantization), with bytes, speed and time left, Cancel, and resume after a cancel or a crash.

Listing reads configs and tokenizers, and downloads talk to the network: both run on threads
(`background.run`) that report to the GUI thread, so the window never waits for them.
`specula.engine.remote.hub` does the work (torch-free).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from specula.app import background
from specula.app.flow import FlowLayout
from specula.app.focus import keyboard_back
from specula.app.folders import chosen, start_folder
from specula.app.heads_list import AddedHeads
from specula.app.theme import mute
from specula.engine.api.memory import RUNTIME_BYTES, available_memory, gigabytes, needed_for

COLUMNS = ("Model", "Where", "Size", "Memory to run", "Architecture", "Context", "Precision", "For the loaded model")
RESULT_COLUMNS = ("Model on the Hub", "Downloads", "Likes", "Files")
WHERE = {"bundled": "bundled", "local": "added", "cache": "Hugging Face cache"}


class ModelsView(QDialog):
    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self.setWindowTitle("Models")
        self.resize(900, 560)
        self.entries: list = []
        self._stop = threading.Event()
        self._downloading: str | None = None
        self._first: tuple[float, int] | None = None  # (when, bytes) of a download's first report: its speed
        self._select_next: str | None = None  # selected once the list being read arrives (a new download)
        self._added: str | None = None  # what the status says once that list arrives (a model added)
        self.listings = 0  # lists shown so far
        self._loading: str | None = None  # what a load this view asked for is (the status says how it ended)
        self._head_added = False  # that load adds a draft head
        self._build()
        window.model_ready.connect(self._loaded)
        window.model_failed.connect(self._load_failed)


    def _loaded(self) -> None:
        """A load this view asked for ended: what loaded, or why a draft head it asked for was left out."""
        self.heads.refresh()  # a head left out is no longer kept
        if self._loading is None:
            return
        why = self.window.loaded.dropped_why.rstrip(".") if self.window.loaded is not None else ""
        if why and self._head_added:
            self.status.setText(f"Not used: {why}. The strategy stays as it was.")
        else:
            self.status.setText(f"Loaded: {self._loading}." + (f" {why[:1].upper()}{why[1:]}." if why else ""))
        if why:  # kept once the list the window asked for arrives
            self._added = self.status.text()
        self._loading = None
        self._head_added = False

    def _load_failed(self, message: str) -> None:
        """A load this view asked for failed: the reason here, where the user looks (the model and the strategy
        stay as they were)."""
        if self._loading is not None:
            self.status.setText(f"Not loaded: {message.rstrip('.')}. The model and strategy stay as they were.")
            self._loading = None
            self._head_added = False
        self.heads.refresh()  # a head that was being added is not kept

    # -- building -----------------------------------------------------------------------------------
    def _build(self) -> None:
        self.table = _table(COLUMNS)
        self.table.horizontalHeaderItem(COLUMNS.index("Memory to run")).setToolTip(
            f"The model's weights and about {gigabytes(RUNTIME_BYTES)} for Specula's engine itself (PyTorch, the "
            "tokenizer): a small model needs about that much more than its file")
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(lambda _: self.use_selected())
        self.status = QLabel("Reading the models on this machine…")
        self.status.setWordWrap(True)
        mute(self.status)
        self.use_button = QPushButton("Use")
        self.use_button.setToolTip("Load it as the model to chat with (kept as the choice once it loaded)")
        self.draft_button = QPushButton("Use as draft")
        self.draft_button.setToolTip("Make it the draft model of the loaded one (strategy draft-model)")
        self.remove_button = QPushButton("Remove from cache…")
        add_folder = QPushButton("Add folder…")
        self.head_button = QPushButton("Add draft head…")
        self.head_button.setToolTip("A folder holding a draft head for the loaded model (one Specula trained, or an "
                                    "EAGLE, EAGLE-3 or Medusa head as its project publishes it): eagle or medusa "
                                    "drafts with it")
        add_file = QPushButton("Add GGUF file…")
        self.use_button.clicked.connect(self.use_selected)
        self.draft_button.clicked.connect(self.draft_selected)
        self.remove_button.clicked.connect(self.remove_selected)
        # each file dialog gives the keyboard back to this view as it closes (`focus.py`)
        folder = lambda title: chosen("model", keyboard_back(self, QFileDialog.getExistingDirectory(  # noqa: E731
            self, title, start_folder("model"))))
        add_folder.clicked.connect(lambda: self._add(folder("A model folder")))
        add_file.clicked.connect(lambda: self._add(chosen("model", keyboard_back(self, QFileDialog.getOpenFileName(
            self, "A GGUF file", start_folder("model"), "GGUF models (*.gguf)"))[0])))
        self.head_button.clicked.connect(lambda: self.add_head(folder("A draft head folder")))
        # two groups of buttons side by side, the second under the first where the window is narrow (800 px)
        buttons = QWidget()
        flow = FlowLayout(buttons, spacing=18)
        flow.setContentsMargins(0, 0, 0, 0)
        for group in ((self.use_button, self.draft_button, self.remove_button), (add_folder, add_file, self.head_button)):
            box = QWidget()
            row = QHBoxLayout(box)
            row.setContentsMargins(0, 0, 0, 0)
            for button in group:
                row.addWidget(button)
            flow.addWidget(box)
        self.hub_id = QLineEdit()
        self.hub_id.setPlaceholderText("a Hugging Face model id, e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
        self.recommended = QComboBox()
        self.recommended.addItem("Recommended…", None)
        self.recommended.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.recommended.setMinimumContentsLength(16)
        from specula.engine.remote.hub import RECOMMENDED

        for item in RECOMMENDED:
            pairs = f", drafts with {item.draft_repo_id.split('/')[-1]}" if item.draft_repo_id else ""
            self.recommended.addItem(f"{item.repo_id} ({item.size_text}{pairs})", item.repo_id)
            self.recommended.setItemData(self.recommended.count() - 1, item.note, Qt.ItemDataRole.ToolTipRole)
        self.recommended.activated.connect(self._recommended_chosen)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(lambda: self.start_download())
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.progress_text = QLabel()
        self.progress_text.setWordWrap(True)  # a failed download's reason (offline: the Hub unreachable) is read whole
        mute(self.progress_text)
        self.search_text = QLineEdit()
        self.search_text.setPlaceholderText("Search the Hugging Face Hub: a name, e.g. SmolLM2 or Qwen2.5")
        self.search_text.returnPressed.connect(lambda: self.search())
        self.gguf_only = QCheckBox("GGUF only")
        self.gguf_only.setToolTip("Only repositories of GGUF files (the format LM Studio, Ollama and llama.cpp use)")
        self.search_button = QPushButton("Search")
        self.search_button.clicked.connect(lambda: self.search())
        self.results = _table(RESULT_COLUMNS)
        self.results.setMaximumHeight(170)
        self.results.setVisible(False)
        self.results.itemSelectionChanged.connect(self._result_chosen)
        self.found: list = []  # the last search's HubModel rows
        self._details_for: str | None = None  # the result whose size and files are shown (or being read)
        self.details = QLabel()
        self.details.setWordWrap(True)
        mute(self.details)
        search = QHBoxLayout()
        search.addWidget(self.search_text, 1)
        search.addWidget(self.gguf_only)
        search.addWidget(self.search_button)
        hub = QHBoxLayout()
        hub.addWidget(self.hub_id, 1)
        hub.addWidget(self.recommended)
        hub.addWidget(self.download_button)
        hub.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.status)
        layout.addWidget(buttons)
        self.heads = AddedHeads(self, _table)
        layout.addWidget(self.heads)
        hub_title = QLabel("<b>From the Hugging Face Hub</b>: search, or name a model; a download resumes where a "
                           "cancelled or interrupted one stopped")
        hub_title.setWordWrap(True)
        layout.addWidget(hub_title)
        layout.addLayout(search)
        layout.addWidget(self.results)
        layout.addWidget(self.details)
        layout.addLayout(hub)
        layout.addWidget(self.progress)
        layout.addWidget(self.progress_text)
        self._update_buttons()

    # -- the list -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Read the models again (on a thread), and show the heads added as the settings keep them."""
        self.heads.refresh()
        extra = [line for line in self.window.settings.added_models.splitlines() if line.strip()]
        current = self.window.settings.model_source
        sources = [*extra, current] if current not in extra else extra
        background.run(self, lambda: _list_models(sources), done=self._show_list, failed=self._list_failed,
                       name="specula-models")

    def _list_failed(self, exc: Exception) -> None:
        self.status.setText(f"The models could not be listed: {exc}")

    def _show_list(self, found) -> None:
        """A list of ModelEntry read: the table, which of them draft for the loaded model, the selection."""
        self.entries = list(found)
        loaded = self._loaded_entry()
        self.table.setRowCount(len(self.entries))
        free = available_memory()
        for row, e in enumerate(self.entries):
            memory, memory_tip = _memory(e, free)
            cells = (e.name, WHERE.get(e.where, e.where), _size(e.size_bytes), memory, e.architecture or "–",
                     f"{e.context_length:,}" if e.context_length else "–", e.quantization or "–",
                     self._relation(e, loaded))
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(memory_tip if col == 3 else e.path or e.source)
                self.table.setItem(row, col, item)
        drafts = [e.name for e in self.entries if loaded is not None and self._can_draft(e, loaded)]
        what = f"{len(self.entries)} model{'s' if len(self.entries) != 1 else ''}"
        self.status.setText(f"{what}. Drafts for the loaded model: {', '.join(drafts) or 'none on this machine'}."
                            if loaded is not None else f"{what}.")
        if self._select_next is not None:
            self.select(self._select_next)
            self._select_next = None
        if self._added is not None:
            self.status.setText(self._added)
            self._added = None
        self.listings += 1
        self._update_buttons()

    def _loaded_entry(self):
        source = self.window.settings.model_source
        return next((e for e in self.entries if e.source == source), None) if self.window.loaded else None

    @staticmethod
    def _can_draft(entry, target) -> bool:
        return entry is not target and bool(entry.vocab_key) and entry.vocab_key == target.vocab_key

    def _relation(self, entry, loaded) -> str:
        if loaded is None:
            return ""
        if entry is loaded:
            heads = [name for name in ("eagle", "medusa") if name in self.window.loaded.strategies]
            return "loaded" + (f" · trained heads: {', '.join(heads)}" if heads else "")
        if self._can_draft(entry, loaded):
            return "can draft (same vocabulary)" + (" · the draft" if entry.source == self.window.settings.draft_source
                                                   else "")
        return "" if entry.vocab_key else "vocabulary unknown"

    def selected(self):
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return self.entries[rows[0].row()] if rows and rows[0].row() < len(self.entries) else None

    def select(self, source: str) -> bool:
        for row, e in enumerate(self.entries):
            if e.source == source:
                self.table.selectRow(row)
                return True
        return False

    def _update_buttons(self) -> None:
        entry = self.selected()
        loaded = self._loaded_entry()
        self.use_button.setEnabled(entry is not None and entry is not loaded)
        self.draft_button.setEnabled(entry is not None and loaded is not None and self._can_draft(entry, loaded))
        self.remove_button.setEnabled(entry is not None and entry.where == "cache")

    # -- actions ------------------------------------------------------------------------------------
    def use_selected(self) -> None:
        entry = self.selected()
        if entry is None:
            return
        w = self.window
        self._loading = entry.name
        w.apply_settings(replace(w.settings, backend="local", model_source=entry.source), reload=True)
        self.status.setText(f"Loading {entry.name}… (it becomes the model to use once it loaded)")

    def draft_selected(self) -> None:
        entry = self.selected()
        if entry is None:
            return
        w = self.window
        self._loading = f"{entry.name} as the draft"
        w.apply_settings(replace(w.settings, draft_source=entry.source, strategy="draft-model"), reload=True,
                         keep_target=True)  # the model loaded now stays: only the draft is read
        self.status.setText(f"Loading {entry.name} as the draft…")

    def add_head(self, path: str) -> None:
        """Load the model again with the draft head in `path` first among its kind (kept for this model), and switch
        to the strategy that drafts with it; a folder that holds no head is refused with the reason, and one made for
        another model is left out by the load, which says why (the strategy stays as it was)."""
        if not path:
            return
        from specula.engine.remote.hub import head_strategy

        try:
            strategy = head_strategy(Path(path))
        except ValueError as exc:
            self.status.setText(f"Not used: {exc}")
            return
        w = self.window
        self._loading = f"the draft head in {path} (strategy {strategy})"
        self._head_added = True
        w.apply_settings(replace(w.settings.with_head(path), strategy=strategy), reload=True)
        self.heads.refresh()
        self.status.setText(f"Loading the model with the draft head in {path} (strategy {strategy})…")

    def remove_selected(self, confirm=None) -> None:
        entry = self.selected()
        if entry is None or entry.where != "cache":
            return
        ask = confirm or (lambda: keyboard_back(self, QMessageBox.question(
            self, "Remove from cache", f"Delete {entry.name} ({_size(entry.size_bytes)}) from the Hugging Face "
            "cache? It can be downloaded again.")) == QMessageBox.StandardButton.Yes)
        if not ask():
            return
        from specula.engine.remote.hub import remove_from_cache

        try:
            freed = remove_from_cache(entry)
        except ValueError as exc:
            self.status.setText(f"Not removed: {exc}")
            return
        self.status.setText(f"Removed {entry.name}: {_size(freed)} freed.")
        self.refresh()

    def _add(self, path: str) -> None:
        if not path:
            return
        from specula.engine.remote.hub import describe

        try:
            describe(path)
        except ValueError as exc:
            self.status.setText(f"Not added: {exc}")
            return
        w = self.window
        lines = [line for line in w.settings.added_models.splitlines() if line.strip()]
        known = path in lines
        if not known:
            w.settings = replace(w.settings, added_models="\n".join([*lines, path]))
            w._save_settings()
        self._select_next = path  # the list shows it selected, and says so
        self._added = f"{'Already in the list' if known else 'Added'}: {Path(path).name}. Select it and press Use to load it."
        self.refresh()

    # -- the Hub's search ---------------------------------------------------------------------------
    def search(self) -> None:
        """List the Hub's text-generation models whose name holds the search text, most downloaded first."""
        text = self.search_text.text().strip()
        self.search_button.setEnabled(False)
        self.details.setText(f"Searching the Hub for “{text}”…" if text else "Listing the Hub's most downloaded models…")
        from specula.engine.remote.hub import search_hub

        gguf = self.gguf_only.isChecked()
        background.run(self, lambda: search_hub(text, gguf), done=self._show_results, failed=self._search_failed,
                       name="specula-hub-search")

    def _search_failed(self, exc: Exception) -> None:
        self.search_button.setEnabled(True)
        self.details.setText(f"Search failed: {exc}")

    def _show_results(self, found) -> None:
        self.search_button.setEnabled(True)
        self._details_for = None
        self.found = list(found)
        self.results.setRowCount(len(self.found))
        for row, m in enumerate(self.found):
            kind = "GGUF" if m.gguf else (m.library or "–")
            for col, text in enumerate((m.repo_id, f"{m.downloads:,}", f"{m.likes:,}", kind)):
                item = QTableWidgetItem(text)
                if col in (1, 2):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.results.setItem(row, col, item)
        self.results.setVisible(bool(self.found))
        count = f"{len(self.found)} model{'s' if len(self.found) != 1 else ''}"
        self.details.setText(f"{count}, most downloaded first: select one for its size and files, then Download."
                             if self.found else "No text-generation model matches.")

    def _result_chosen(self) -> None:
        rows = self.results.selectionModel().selectedRows() if self.results.selectionModel() else []
        if not rows or rows[0].row() >= len(self.found):
            return
        repo = self.found[rows[0].row()].repo_id
        if repo == self._details_for:
            return  # shown, or on its way
        self._details_for = repo
        self.hub_id.setText(repo)
        self.details.setText(f"{repo}: reading its files…")
        from specula.engine.remote.hub import hub_details

        background.run(self, lambda: hub_details(repo), done=lambda d: self._show_details(repo, d),
                       failed=lambda exc: self.details.setText(f"{repo}: {exc}"), name="specula-hub-details")

    def _show_details(self, repo: str, details) -> None:
        if self.hub_id.text().strip() != repo:
            return  # another one was chosen meanwhile
        text = f"{repo}: {_size(details.size_bytes)} in {details.files} model file{'s' if details.files != 1 else ''}"
        if details.quantizations:
            text += " · GGUF: " + ", ".join(f"{q} {_size(n)}" for q, n in details.quantizations)
            text += " (Download asks which)"
        self.details.setText(text)

    # -- downloads ----------------------------------------------------------------------------------
    def _recommended_chosen(self, index: int) -> None:
        repo = self.recommended.itemData(index)
        if repo:
            self.hub_id.setText(repo)
        self.recommended.setCurrentIndex(0)

    def start_download(self, filename: str | None = None) -> None:
        """Download the repo named in the field; a GGUF repository first asks which file."""
        repo = self.hub_id.text().strip()
        if not repo or self._downloading:
            return
        if filename is None and "gguf" in repo.lower():
            self._set_busy(repo, "Looking up the repository's GGUF files…")
            background.run(self, lambda: _gguf_files(repo), done=lambda found: self._choose_file(repo, found),
                           failed=self._files_failed, name="specula-hub-files")
            return
        self._download(repo, filename)

    def _files_failed(self, exc: Exception) -> None:
        self._downloading = None
        self._set_idle()
        self.progress_text.setText(f"Download failed: {str(exc) or 'the repository could not be read'}")

    def _choose_file(self, repo: str, found: list) -> None:
        """The repository's GGUF files, [(filename, size)]: the user picks one (none: the whole snapshot)."""
        self._downloading = None
        self._set_idle()
        if not found:
            self._download(repo, None)
            return
        labels = [f"{name} ({_size(size)})" for name, size in found]
        label, ok = QInputDialog.getItem(self, "Choose a file", f"{repo} has these GGUF files (quantizations):",
                                         labels, 0, False)
        if ok and label in labels:
            self._download(repo, found[labels.index(label)][0])

    def _download(self, repo: str, filename: str | None) -> None:
        self._stop.clear()
        self._set_busy(repo, f"Downloading {filename or repo}…")
        self.progress.setRange(0, 0)
        self.progress.setVisible(True)
        self._first = None
        stop = self._stop.is_set

        def work(report) -> Path:
            from specula.engine.remote.hub import download

            return Path(download(repo, filename, report, stop))

        background.run(self, work, done=lambda path: self._downloaded(path, repo),
                       failed=lambda exc: self._download_failed(exc, repo), progress=self._show_progress,
                       name="specula-download")

    def cancel_download(self) -> None:
        self._stop.set()
        self.progress_text.setText("Cancelling… (what was downloaded is kept: Download resumes from there)")

    def _show_progress(self, done: int, total: int) -> None:
        """Bytes done of the total, with the speed and the time left."""
        now = time.monotonic()
        if self._first is None:
            self._first = (now, done)  # a resumed download starts past 0: speed counts from here
        t0, d0 = self._first
        speed = (done - d0) / (now - t0) if now > t0 + 0.5 else 0.0
        if total > 0:
            self.progress.setRange(0, 1000)
            self.progress.setValue(int(1000 * done / total))
        left = f", {_duration((total - done) / speed)} left" if speed > 0 and total > done else ""
        rate = f" at {_size(int(speed))}/s" if speed > 0 else ""
        of = f" of {_size(total)}" if total > 0 else ""
        self.progress_text.setText(f"{_size(done)}{of}{rate}{left}")

    def _downloaded(self, path: Path, repo: str) -> None:
        """A download finished: the list is read again and shows it selected."""
        self._download_ended()
        self.progress_text.setText(f"Downloaded {repo} to {path}.")
        self._select_next = str(path) if path.suffix == ".gguf" else repo
        self.refresh()

    def _download_failed(self, exc: Exception, repo: str) -> None:
        """A download cancelled (what it fetched is kept) or failed: says which."""
        from specula.engine.remote.hub import Cancelled

        self._download_ended()
        if isinstance(exc, Cancelled):
            self.progress_text.setText(f"Download of {repo} cancelled; Download resumes it.")
        else:
            self.progress_text.setText(f"Download failed: {str(exc) or 'the download failed'}")

    def _download_ended(self) -> None:
        self._downloading = None
        self._set_idle()
        self.progress.setVisible(False)

    def _set_busy(self, repo: str, text: str) -> None:
        self._downloading = repo
        self.download_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.progress_text.setText(text)

    def _set_idle(self) -> None:
        self.download_button.setEnabled(True)
        self.cancel_button.setEnabled(False)


def _list_models(sources: list[str]) -> list:
    """The models on this machine, ModelEntry each (on a worker thread: it reads configs and tokenizers)."""
    from specula.engine.remote.hub import list_models

    return list_models(sources)


def _gguf_files(repo: str) -> list[tuple[str, int]]:
    """A repository's GGUF files and their sizes (on a worker thread: it asks the Hub)."""
    from specula.engine.remote.hub import gguf_files

    return gguf_files(repo)


def _table(columns: tuple[str, ...]) -> QTableWidget:
    """A read-only list whose rows are chosen one at a time, its first column taking the width left."""
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(columns)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return table


def _memory(entry, free: int | None) -> tuple[str, str]:
    """The memory column of an entry and its tooltip: what running it takes (a GGUF runs as the file stores it, a
    folder's weights as they are stored, either with about 1 GB of runtime) against what is free now. The cell says
    what the runtime's share is: "about 1.1 GB" for a 94 MB model read as a mistake."""
    if entry.size_bytes <= 0:
        return "–", ""
    needed = needed_for(entry.size_bytes)
    tip = (f"Running it takes about {gigabytes(needed)} of memory: its weights ({_size(entry.size_bytes)}) and about "
           f"{gigabytes(RUNTIME_BYTES)} for Specula's engine itself (PyTorch, the tokenizer), besides what a long "
           "conversation adds")
    text = f"about {gigabytes(needed)} ({gigabytes(RUNTIME_BYTES)} engine)"
    if free is None:
        return text, tip + "."
    if needed > free:
        return f"{gigabytes(needed)}: more than free", tip + f": more than the {gigabytes(free)} free now."
    return text, tip + f"; {gigabytes(free)} is free now."


def _size(n: int) -> str:
    if n <= 0:
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
