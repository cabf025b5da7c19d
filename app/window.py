"""The main window: conversations on the left, the transcript and composer in the centre, live plots
in a dock on the right, generation controls in the toolbar and the model's state in the status bar.

It routes the engine's events (delivered on the GUI thread by `EngineBridge`): loading events update
the state here, a reply's events go to `ChatController`, a comparison's to `CompareController`. The
links under messages (`ChatView.action_requested`) and the Chat menu end up in `_on_action`. Nothing
here imports torch; the engine is imported by the bridge's worker and, once a model is loaded, for its
registry and requests.
"""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSizePolicy,
    QSplitter,
    QToolBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from specula.app import actions
from specula.app.bridge import EngineBridge
from specula.app.chat import ChatController, first_answer
from specula.app.chatview import ChatView
from specula.app.compare import CompareController
from specula.app.composer import Composer
from specula.app.controls import Controls
from specula.app.focus import keyboard_back
from specula.app.folders import chosen, start_folder
from specula.app.history_db import ConversationDB
from specula.app.layout import fit_to_screen, restore_layout, save_layout
from specula.app.legend import LegendBar
from specula.app.notice import NoticeBar
from specula.app.plots import PlotsPanel
from specula.app.settings import Settings, SettingsStore
from specula.app.sidebar import ConversationList
from specula.app.statusbar import FittingStatusBar
from specula.app.theme import THEMES, apply_theme
from specula.app.tokens import model_label
from specula.engine.api.events import Capabilities, Failed, Loaded, Loading  # plain dataclasses: no torch

STATE_COLOURS = {"starting": "#8d96a0", "loading": "#d29922", "ready": "#2da44e", "generating": "#0969da",
                 "failed": "#cf222e"}


class MainWindow(QMainWindow):
    model_ready = Signal()
    model_failed = Signal(str)

    def __init__(self, settings_store: SettingsStore | None = None, history: ConversationDB | None = None,
                 bridge: EngineBridge | None = None, overrides: dict | None = None) -> None:
        super().__init__()
        self.setWindowTitle("Specula")
        self.settings_store = settings_store or SettingsStore()
        loaded = self.settings_store.load()
        self.overrides = dict(overrides or {})
        self._stored = loaded.settings  # what the settings file holds
        self.settings: Settings = replace(loaded.settings, **self.overrides)
        self.state = "starting"
        self.loaded = None  # the engine's Loaded event
        self.strategy_unavailable: str | None = None  # a requested strategy the model cannot use
        self.falling_back = False  # a failed load of a chosen model is followed by the bundled model's
        self.bridge = bridge or EngineBridge(parent=self)
        self._build_widgets()
        self.chat = ChatController(history or ConversationDB(), self.bridge, self.view, self.plots, self)
        self.compare = CompareController(self.bridge, self.view, self.plots, self)
        self._editing: tuple[str, object] | None = None  # (conversation id, the Turn being edited)
        self.train_dialog = None
        self.models_view = None
        self._store_notice: str | None = None  # the banner of a failing save, while it fails
        self._last_good: Settings | None = None  # the settings before a model change, until the new model loads
        self.theme = "system"  # View > Theme (set from the remembered layout)
        self._following_system = False  # the desktop's colour scheme changes are followed
        self._narrow = False  # the window is narrower than NARROW (the chat list folded away)
        self._plots_gave_way = False  # the plots were hidden so that the chat stays readable beside the chat list
        self._build_menus()
        self._connect()
        self.controls.show_settings(self.settings)
        if loaded.notice:
            self.notices.add(loaded.notice)
        for notice in self.chat.load():
            self.notices.add(notice)
        self._refresh_conversations()
        restore_layout(self)
        self._set_state("starting")

    # -- building -----------------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        self.view = ChatView()
        self.legend = LegendBar(self.view.colours)
        self.notices = NoticeBar()
        self.composer = Composer()
        self.sidebar = ConversationList()
        self.plots = PlotsPanel()
        column = QWidget()
        layout = QVBoxLayout(column)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        notice_row = QWidget()
        notice_layout = QVBoxLayout(notice_row)
        notice_layout.setContentsMargins(10, 8, 10, 0)
        notice_layout.addWidget(self.notices)
        for widget, stretch in ((notice_row, 0), (self.legend, 0), (self.view, 1), (self.composer, 0)):
            layout.addWidget(widget, stretch)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.setObjectName("mainSplitter")
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(column)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([230, 700])
        self.splitter.setChildrenCollapsible(False)
        self.setCentralWidget(self.splitter)
        self.dock = QDockWidget("Live metrics", self)
        self.dock.setObjectName("metricsDock")
        self.dock.setWidget(self.plots)
        self.dock.setMinimumWidth(320)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.dock)
        self._build_toolbar()
        self.setStatusBar(FittingStatusBar(self))
        self._build_status_bar()

    def _build_toolbar(self) -> None:
        self.controls = Controls()
        bar = QToolBar("Generation")
        bar.setObjectName("generationToolbar")
        bar.setMovable(False)
        self.chats_action = QAction("☰ Chats", self)
        self.chats_action.setCheckable(True)
        self.chats_action.setChecked(True)
        self.chats_action.setShortcut(QKeySequence("Ctrl+Shift+L"))
        self.chats_action.setToolTip("Show or hide the list of chats (Ctrl+Shift+L); a narrow window hides it")
        self.chats_action.toggled.connect(self.sidebar.setVisible)
        self.chats_action.toggled.connect(lambda _: QTimer.singleShot(0, self._keep_chat_readable))
        bar.addAction(self.chats_action)
        bar.addWidget(self.controls)
        spacer = QWidget()
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        bar.addWidget(spacer)
        self.compare_action = QAction("Compare with plain decoding", self)
        self.compare_action.setToolTip("Run the last prompt again without speculation and with the current "
                                       "strategy (same seed): both speeds, the speedup, identical or not")
        bar.addAction(self.compare_action)
        self.settings_action = QAction("Settings…", self)
        self.settings_action.setShortcuts(_with(QKeySequence.StandardKey.Preferences, "Ctrl+,"))
        bar.addAction(self.settings_action)
        self.addToolBar(bar)

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.status_labels = {}
        for key in ("model", "device", "dtype", "strategy"):
            label = QLabel()
            label.setContentsMargins(6, 0, 6, 0)
            self.status_labels[key] = label
            bar.addPermanentWidget(label)
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setMaximumWidth(120)
        self.busy.setMaximumHeight(14)
        self.busy.setTextVisible(False)
        bar.addPermanentWidget(self.busy)
        self.state_label = QLabel()
        self.state_label.setContentsMargins(6, 0, 10, 0)
        bar.addPermanentWidget(self.state_label)

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        new_action = file_menu.addAction("New chat")
        new_action.setShortcuts(_with(QKeySequence.StandardKey.New, "Ctrl+N"))
        new_action.triggered.connect(self._new_conversation)
        models_action = file_menu.addAction("Models…")
        models_action.setShortcut(QKeySequence("Ctrl+Shift+M"))
        models_action.setToolTip("The models on this machine, downloads, and drafts for the loaded model")
        models_action.triggered.connect(self.open_models)
        file_menu.addAction(self.settings_action)
        self.train_action = file_menu.addAction("Train a draft head…")
        self.train_action.setToolTip("Teach a small head to draft for the loaded model (eagle, medusa)")
        self.train_action.triggered.connect(self.open_training)
        file_menu.addSeparator()
        quit_action = file_menu.addAction("Quit")
        quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        quit_action.triggered.connect(self.close)
        chat_menu = self.menuBar().addMenu("&Chat")
        self.regenerate_action = chat_menu.addAction("Regenerate last answer")
        self.regenerate_action.setShortcut(QKeySequence("Ctrl+R"))
        self.regenerate_action.triggered.connect(lambda: self._on_action(actions.REGENERATE, -1))
        self.version_actions = {}
        for name, label, key in ((actions.OLDER, "Previous version of the last answer", "Alt+Left"),
                                 (actions.NEWER, "Next version of the last answer", "Alt+Right")):
            action = chat_menu.addAction(label)
            action.setShortcut(QKeySequence(key))
            action.triggered.connect(lambda _=False, n=name: self._on_action(n, -1))
            self.version_actions[name] = action
        chat_menu.aboutToShow.connect(self._update_actions)  # the chat shown may have changed since
        chat_menu.addAction(self.compare_action)
        view_menu = self.menuBar().addMenu("&View")
        view_menu.addAction(self.chats_action)
        theme_menu = view_menu.addMenu("Theme")
        group = QActionGroup(self)
        self.theme_actions = {}
        for name, label in THEMES:
            action = theme_menu.addAction(label)
            action.setCheckable(True)
            action.setActionGroup(group)
            action.triggered.connect(lambda _=False, n=name: self.set_theme(n))
            self.theme_actions[name] = action
        self.ghost_action = view_menu.addAction("Show rejected drafts")
        self.ghost_action.setCheckable(True)
        self.ghost_action.setChecked(False)
        view_menu.addAction(self.dock.toggleViewAction())
        help_menu = self.menuBar().addMenu("&Help")
        help_menu.addAction("About Specula").triggered.connect(self._about)

    def _store_failed(self, message: str) -> None:
        """A save failed: one banner that says what and where (the chat goes on; saving is retried)."""
        text = f"Not saved: {message}. Everything stays on screen; saving is retried every few seconds."
        if self._store_notice != text:
            self.notices.remove(self._store_notice or "")
            self._store_notice = text
            self.notices.add(text)

    def _store_recovered(self) -> None:
        if self._store_notice:
            self.notices.remove(self._store_notice)
            self._store_notice = None
            self.statusBar().showMessage("Conversations are saved again.", 5000)

    def _connect(self) -> None:
        self.bridge.event.connect(self._on_event)
        self.bridge.notice.connect(lambda text: self.statusBar().showMessage(text))
        self.bridge.restarting.connect(self._engine_restarting)
        self.composer.send_requested.connect(self.send_text)
        self.composer.stop_requested.connect(self._stop)
        self.composer.edit_cancelled.connect(self._end_edit)
        self.view.action_requested.connect(self._on_action)
        self.compare_action.triggered.connect(self.compare_last)
        self.controls.changed.connect(self._controls_changed)
        self.legend.ghosts_toggled.connect(self.set_ghosts)
        self.ghost_action.toggled.connect(self.set_ghosts)
        self.sidebar.new_requested.connect(self._new_conversation)
        self.sidebar.selected.connect(self._select)
        self.chat.store_failed.connect(self._store_failed)
        self.chat.store_recovered.connect(self._store_recovered)
        self.chat.step_notice.connect(self._step_notice)
        self.chat.reading.connect(lambda text: self.statusBar().showMessage(text) if text else self.statusBar().clearMessage())
        self.sidebar.renamed.connect(self.chat.rename)
        self.sidebar.delete_requested.connect(self._confirm_delete)
        self.sidebar.search_changed.connect(lambda _: self._refresh_conversations())
        self.sidebar.export_requested.connect(self.export_conversation)
        self.chat.conversations_changed.connect(self._refresh_conversations)
        self.chat.conversations_changed.connect(self._update_actions)  # another chat or version shown
        self.chat.generating_changed.connect(self._generating_changed)
        self.compare.running_changed.connect(self._generating_changed)
        self.settings_action.triggered.connect(self._open_settings)

    # -- the model ----------------------------------------------------------------------------------
    def start(self, keep_target: bool = False) -> None:
        """Load the model named by the settings (the answer arrives as events); `keep_target`: only the draft
        changed, and the engine keeps the model it has where it is the one the settings name."""
        from specula.engine.api.types import LoadRequest

        s = self.settings
        self._set_state("loading")
        request = s.load_request(prepare=first_answer(s))
        self.bridge.load(replace(request, keep_target=True) if keep_target and isinstance(request, LoadRequest)
                         else request)
        QTimer.singleShot(0, self.plots.draw_ahead)  # the engine loads in its own process meanwhile

    def _on_event(self, event) -> None:
        for controller in (self.chat, self.compare):
            if controller.owns(event):
                controller.on_event(event)
                return
        training = self.train_dialog is not None and self.train_dialog.owns(event)
        if training and isinstance(event, Failed) and self.train_dialog.isVisible():
            return  # the dialog shows it
        match event:
            case Loading():
                if self.state == "ready":  # the engine reloads the model after it restarted
                    self._set_state("loading")
                self.statusBar().showMessage(event.message)
            case Loaded():
                self._on_loaded(event)
            case Failed():
                self._on_load_failed(event)

    def _on_loaded(self, event) -> None:
        self.loaded = event
        self.chat.chat_template = self.compare.chat_template = event.chat
        self.chat.model_name = model_label(event.target)
        base = (f"{event.target.split(' (')[0]} has no chat template (a base model): "
                "each message is continued as plain text")
        for warning in event.warnings + (() if event.chat else (base,)) + ((event.path,) if event.path else ()):
            if warning not in self.notices.messages:
                self.notices.add(warning)
        self.strategy_unavailable = None
        if event.dropped_head:
            self._drop_head(event)
        if not self.can.strategies:
            self.controls.set_server()  # the saved local strategy stays in the settings for later
        else:
            self._offer_strategies(event.strategies)
        self.plots.set_model(event)
        # the names without their details (file kind, where from), so that a small window shows both; the
        # whole names in the tooltip
        short = lambda name: name.split(" (")[0]  # noqa: E731
        self.status_labels["model"].setText(short(event.target) + (f"  ·  draft: {short(event.draft)}" if event.draft else ""))
        self.status_labels["model"].setToolTip(event.target + (f"\ndraft: {event.draft}" if event.draft else ""))
        self.status_labels["device"].setText(event.device)
        self.status_labels["dtype"].setText(event.weights or event.dtype if self.can.precision else "")
        self.statusBar().showMessage(f"Loaded {event.target}", 4000)
        if event.step:  # a step built in the background from now on is said at once, not at the first message
            self.chat.step_changed(event.step)
        if self._last_good is not None or event.dropped_head:  # the new model loaded: now it is the one to use next
            self._last_good = None  # time too (without a head it left out)
            self._save_settings()
        if self.models_view is not None and self.models_view.isVisible():
            self.models_view.refresh()  # which model is loaded, and what can draft for it
        self._set_state("ready")
        self.composer.input.setFocus()
        self.model_ready.emit()

    def _drop_head(self, event) -> None:
        """The load left out the draft head it was asked for (it does not fit the model, or could not be read): the
        model is kept, the head is no longer kept for it, and a line says why. A head that was just added (Models
        view) leaves the strategy as it was before."""
        self.notices.add(f"{event.dropped_why.rstrip('.')}; it is no longer kept for this model.")
        if self.settings.draft_head != event.dropped_head:
            return  # the model's head changed meanwhile
        before = self._last_good
        added = before is not None and before.draft_heads.get(self.settings.model_source) != event.dropped_head
        self.settings = self.settings.with_head("")
        if added:
            self.settings = replace(self.settings, strategy=before.strategy)
            self.controls.show_settings(self.settings)

    @property
    def can(self) -> Capabilities:
        """What the loaded backend offers (a local engine's, until one is loaded)."""
        return self.loaded.capabilities if self.loaded is not None else Capabilities()

    def _offer_strategies(self, usable) -> None:
        from specula.engine.api.strategies import STRATEGIES

        wanted = self.settings.strategy
        chosen = self.controls.set_strategies(STRATEGIES, usable, wanted)
        if chosen != wanted:
            self.strategy_unavailable = wanted
            self.notices.add(f"Strategy “{wanted}” is not available for this model; using “{chosen}”.")
            self.settings = replace(self.settings, strategy=chosen)

    def _on_load_failed(self, event) -> None:
        if self.state in ("loading", "starting"):
            kept = f" The previous model ({self.loaded.target}) is still in use." if self.loaded else ""
            what = "The server could not be reached" if self.settings.remote else "The model could not be loaded"
            if self._last_good is not None:  # a change failed: the last model that loaded stays the choice, and the
                # strategy chosen with it (a head's) goes back to the one before
                self.settings = replace(self.settings, **_load_fields(self._last_good), strategy=self._last_good.strategy)
                self._last_good = None
                self.controls.show_settings(self.settings)
                self._save_settings()
                self._update_status()
            self._set_state("failed" if self.loaded is None else "ready")
            self.statusBar().clearMessage()  # not "loading…" any more
            fallback = self.loaded is None and not self.settings.remote and self.settings.model_source != "bundled"
            if fallback:  # the app stays usable: the bundled model for this run, the saved choice untouched
                kept = " Using the bundled model for now; Settings… chooses another."
            message = f"{what}: {event.message.rstrip('.')}.{kept}"
            if fallback:  # a banner above the chat, whatever page of it is shown, until dismissed
                self.notices.add(message)
            else:
                self.view.add_turn(_error_turn(message), transient=True)
            self.falling_back = fallback  # for the slots of model_failed: the bundled model loads next
            self.model_failed.emit(event.message)
            if fallback:
                # the bundled model with its own draft head, if one was added for it
                self.overrides.update(model_source="bundled", draft_source="", weights="auto")
                self.settings = replace(self.settings, **{k: self.overrides[k] for k in ("model_source", "draft_source",
                                                                                         "weights")})
                self.start()
        else:
            self.notices.add(event.message)

    # -- chatting -----------------------------------------------------------------------------------
    def send_text(self, text: str) -> bool:
        if self.state != "ready" or self.compare.running:
            return False
        replace_from = None
        if self._editing is not None and self._editing[0] == self.chat.current_id:
            replace_from = self.chat.index_of(self._editing[1])
        self._end_edit()
        return self.chat.send(text, self.request_settings, replace_from)

    @property
    def request_settings(self):
        """The settings a request is built from: a server speculates as it was told ("server")."""
        return self.settings if self.can.strategies else replace(self.settings, strategy="server")

    def compare_last(self) -> bool:
        """Compare plain decoding with the current strategy on the last prompt (a card in the chat)."""
        if self.state != "ready" or self.chat.reply is not None:
            return False
        messages = self.chat.last_prompt(self.settings.system_prompt)
        if not messages:
            self.statusBar().showMessage("Send a message first: the comparison re-runs the last prompt.", 5000)
            return False
        return self.compare.start(messages, self.settings, self.chat.last_answers())

    def _on_action(self, name: str, index: int) -> None:
        """A link under a message, its context menu, or the Chat menu (index -1: the last answer)."""
        item = self.view.item(index)
        if name == actions.COPY and item is not None:
            QApplication.clipboard().setText(item.content)
            self.statusBar().showMessage("Answer copied to the clipboard", 3000)
        elif name == actions.MARKDOWN:
            self.view.toggle_markdown(index)
        elif name in (actions.OLDER, actions.NEWER):
            if index < 0:  # the Chat menu: the last answer
                index = next((i for i in range(len(self.chat.current.turns) - 1, -1, -1)
                              if self.chat.current.turns[i].role == "assistant"), -1)
                item = self.chat.current.turns[index] if index >= 0 else None
            if item is not None:
                self.chat.show_version(item, -1 if name == actions.OLDER else 1)
                self._update_actions()
        elif name in (actions.REGENERATE, actions.RETRY) and self.state == "ready" and not self.compare.running:
            self._end_edit()
            self.chat.regenerate(self.request_settings)
        elif name == actions.EDIT and item is not None and self.chat.index_of(item) is not None:
            self._editing = (self.chat.current_id, item)
            self.composer.begin_edit(item.content)

    def _end_edit(self) -> None:
        self._editing = None
        self.composer.end_edit()

    def _stop(self) -> None:
        self.chat.stop()
        self.compare.stop()

    def _new_conversation(self) -> None:
        if not self.compare.running:
            self._end_edit()
            self.chat.new_conversation()

    def _select(self, conversation_id: str) -> None:
        if conversation_id != self.chat.current_id:
            self._end_edit()
        self.chat.select(conversation_id)
        self._update_actions()

    def _generating_changed(self, generating: bool) -> None:
        self.sidebar.setEnabled(not generating)
        self._update_actions()
        if generating:
            self._set_state("generating")
        elif self.state == "generating":  # not while a reload that stopped the reply is under way
            self._set_state("ready")

    def _controls_changed(self) -> None:
        self.settings = self.controls.applied_to(self.settings)
        self._save_settings()
        self._update_status()

    def _save_settings(self) -> None:
        stored = self.settings
        for key, value in self.overrides.items():  # one-run choices from the command line stay unsaved
            if getattr(stored, key) == value:
                stored = replace(stored, **{key: getattr(self._stored, key)})
        if self._last_good is not None:  # a model change is loading: the file keeps the model that works
            stored = replace(stored, **_load_fields(self._stored))
        try:
            self.settings_store.save(stored)
            self._stored = stored
        except OSError as exc:
            self.notices.add(f"Settings could not be saved: {exc}")

    def set_theme(self, theme: str) -> None:
        """Light, dark, or whatever the desktop says (followed when it changes)."""
        self.theme = theme if theme in self.theme_actions else "system"
        self.theme_actions[self.theme].setChecked(True)
        app = QApplication.instance()
        apply_theme(app, self.theme)
        self._tint_overflow_buttons()
        if not self._following_system:
            self._following_system = True
            app.styleHints().colorSchemeChanged.connect(lambda _: self.theme == "system" and self.set_theme("system"))

    def _tint_overflow_buttons(self) -> None:
        """The » a narrow toolbar shows for what does not fit: drawn in the palette's text colour (the
        style's own arrow is black, invisible on the dark theme)."""
        from PySide6.QtGui import QIcon, QPainter, QPalette, QPixmap

        colour = QApplication.instance().palette().color(QPalette.ColorRole.ButtonText)
        for bar in self.findChildren(QToolBar):
            button = bar.findChild(QToolButton, "qt_toolbar_ext_button")
            if button is None:
                continue
            pixmap = QPixmap(32, 32)
            pixmap.fill(Qt.GlobalColor.transparent)
            painter = QPainter(pixmap)
            font = painter.font()
            font.setPixelSize(26)
            font.setBold(True)
            painter.setFont(font)
            painter.setPen(colour)
            painter.drawText(pixmap.rect(), Qt.AlignmentFlag.AlignCenter, "»")
            painter.end()
            button.setIcon(QIcon(pixmap))
            button.setToolTip("More: what does not fit in this width")

    def set_ghosts(self, show: bool) -> None:
        for widget in (self.legend.ghosts, self.ghost_action):
            widget.blockSignals(True)
            widget.setChecked(show)
            widget.blockSignals(False)
        self.view.set_show_ghosts(show)
        self.legend.show_rejected(show)

    def _open_settings(self) -> None:
        from specula.app.settings_dialog import SettingsDialog, needs_reload

        usable = tuple(self.loaded.strategies) if self.loaded is not None and self.can.strategies else None
        dialog = SettingsDialog(self.settings, self, usable, history=self.chat.store)
        accepted = self.take_keyboard(dialog.exec())
        dialog.deleteLater()  # a new one each time, from the settings as they are then
        if not accepted:
            return
        new = dialog.result_settings()
        self.apply_settings(new, needs_reload(self.settings, new) or (new.remote and dialog.remote.key_stored))

    def take_keyboard(self, result=None):
        """A dialog or view closed, however (OK, Cancel, Esc, its close button): the chat window takes the keyboard
        back and the message box the focus, so that Ctrl+N and typing work at once (`focus.py`). Connected to
        the window's dialogs' `finished`, or around what a blocking one returned, which it returns."""
        return keyboard_back(self.composer.input, result)

    def apply_settings(self, new: Settings, reload: bool, keep_target: bool = False) -> None:
        """Settings the user confirmed (the dialog, the Models view); `reload`: load the model they name
        (`keep_target`: only its draft, the model loaded now kept). A new model becomes the saved choice only once
        it loaded."""
        if reload and self.loaded is not None and self._last_good is None:
            self._last_good = self.settings  # saved as the model to use only once the new one loads
        self.settings = new
        # a one-run choice from the command line that the user left as it was stays this run's only (unsaved);
        # one they changed is their new setting, saved
        self.overrides = {key: value for key, value in self.overrides.items() if getattr(new, key) == value}
        self.controls.show_settings(self.settings)  # the toolbar shows the strategy chosen there
        self._save_settings()
        self._update_status()
        if reload:
            self.chat.stop()
            self.start(keep_target)

    def open_models(self) -> None:
        """The Models view (one per window)."""
        from specula.app.models_view import ModelsView

        first = self.models_view is None
        if first:
            self.models_view = ModelsView(self)
            self.models_view.finished.connect(self.take_keyboard)
        self.models_view.show()
        if first:
            fit_to_screen(self.models_view)  # 900x560 by default: cut and moved onto a smaller screen
        self.models_view.raise_()
        self.models_view.refresh()

    def open_training(self) -> None:
        """The draft-head training dialog (one per window; it keeps its state between openings)."""
        from specula.app.train_dialog import TrainDialog

        if self.loaded is None or not self.can.training:
            return
        if self.train_dialog is None:
            self.train_dialog = TrainDialog(self.bridge, self.loaded.target, self)
            self.train_dialog.use_requested.connect(self._use_strategy)
            self.train_dialog.finished.connect(self.take_keyboard)
        self.train_dialog.show()
        self.train_dialog.raise_()

    def _use_strategy(self, name: str) -> None:
        self.settings = replace(self.settings, strategy=name)
        self.controls.show_settings(self.settings)
        self._save_settings()

    def _confirm_delete(self, conversation_id: str) -> None:
        title = self.chat.conversations[conversation_id].title
        answer = self.take_keyboard(QMessageBox.question(self, "Delete conversation",
                                                         f"Delete “{title}”? This cannot be undone."))
        if answer == QMessageBox.StandardButton.Yes:
            self.chat.delete(conversation_id)

    def _update_actions(self) -> None:
        idle = self.state == "ready" and self.chat.reply is None and not self.compare.running
        has_prompt = self.chat.current_id is not None and self.chat.last_user_index() is not None
        self.compare_action.setEnabled(idle and has_prompt and self.can.compare)
        self.regenerate_action.setEnabled(idle and has_prompt)
        self.train_action.setEnabled(idle and self.loaded is not None and self.can.training)
        # the last answer's other versions, where it has any (they were offered in an empty chat)
        turns = self.chat.current.turns if self.chat.current_id is not None else ()
        last = next((t for t in reversed(turns) if t.role == "assistant"), None)
        count, at = (len(last.all_versions), last.version) if last is not None else (1, 0)
        self.version_actions[actions.OLDER].setEnabled(idle and at > 0)
        self.version_actions[actions.NEWER].setEnabled(idle and at < count - 1)

    def export_conversation(self, conversation_id: str, fmt: str, path: str | None = None) -> None:
        """Write a conversation as Markdown or JSON where the user chooses (`path`: no dialog)."""
        import json
        from pathlib import Path

        from PySide6.QtWidgets import QFileDialog

        from specula.app.history import to_markdown

        if conversation_id not in self.chat.conversations:
            return
        conv = self.chat.full(conversation_id)
        if path is None:
            stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title).strip() or "chat"
            kind = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
            path, _ = self.take_keyboard(QFileDialog.getSaveFileName(
                self, "Export conversation", str(Path(start_folder("export")) / f"{stem}.{fmt}"), kind))
            if not chosen("export", path):
                return
        text = to_markdown(conv) if fmt == "md" else json.dumps(conv.to_dict(), ensure_ascii=False, indent=1)
        try:
            Path(path).write_text(text, encoding="utf-8")
        except OSError as exc:
            self.notices.add(f"The conversation could not be exported to {path}: {exc.strerror or exc}")
            return
        self.statusBar().showMessage(f"Exported “{conv.title}” to {path}", 5000)

    def _step_notice(self, text: str) -> None:
        """The decoding step being prepared (kept until it is ready, its explanation as the tooltip) or ready."""
        preparing = text == ChatController.PREPARING
        self.statusBar().showMessage(text, 0 if preparing else 8000)
        self.statusBar().setToolTip(ChatController.PREPARING_TIP if preparing else "")

    def _refresh_conversations(self) -> None:
        self._update_actions()
        text = self.sidebar.search.text().strip()
        if text:  # a search is on: its results, best first
            found = self.chat.search(text)
            chats = [self.chat.conversations[cid] for cid in found]
            self.sidebar.show_conversations(chats, self.chat.current_id, found)
        else:
            self.sidebar.show_conversations(self.chat.ordered(), self.chat.current_id)
        if self.chat.current_id is not None:
            self.setWindowTitle(f"{self.chat.current.title} — Specula")

    # -- state --------------------------------------------------------------------------------------
    def _engine_restarting(self) -> None:
        """The engine process stopped and another is loading the model: not "ready" meanwhile (it said so)."""
        if self.state in ("ready", "generating"):
            self._set_state("loading")

    def _set_state(self, state: str) -> None:
        self.state = state
        hint = "The model could not be loaded: choose another in Settings…" if state == "failed" else None
        self.composer.set_state(ready=state in ("ready", "generating"), generating=state == "generating", hint=hint)
        self.controls.setEnabled(state in ("ready", "generating"))
        self._update_actions()
        # only while a model loads: an animated bar repaints many times a second, and while an answer
        # streams (which shows its own progress) that took the engine's cores from it on a small machine
        self.busy.setVisible(state in ("starting", "loading"))
        self._update_status()

    def _update_status(self) -> None:
        colour = STATE_COLOURS.get(self.state, "#8d96a0")
        self.state_label.setText(f"<span style='color:{colour}'>●</span> {self.state}")
        strategy = self.settings.strategy if self.can.strategies else "server"
        self.status_labels["strategy"].setText(f"strategy: {strategy}")
        if self.loaded is None:
            wanted = self.settings.server_url if self.settings.remote else self.settings.model_source
            self.status_labels["model"].setText(wanted if self.state != "ready" else "")

    def _about(self) -> None:
        QMessageBox.about(self, "About Specula", "<b>Specula</b><br>Chat with local language models and watch "
                          "speculative decoding at work.<br>Apache-2.0.")
        self.take_keyboard()

    # -- geometry -----------------------------------------------------------------------------------
    def save_layout(self) -> None:
        save_layout(self)

    # below this width the chat list folds away (the toolbar's ☰ Chats brings it back): at 1024 px it took 230 px of
    # a chat column left at about 290, where code wrapped mid-expression
    NARROW = 1200
    DOCK_SHARE = 1 / 3  # the most of the window's width the docked plots keep when it shrinks (at least their least)

    def resizeEvent(self, event) -> None:
        """Crossing NARROW shows or hides the chat list, so a small window gives the transcript the room;
        the user's own choice holds until the width crosses it again."""
        super().resizeEvent(event)
        narrow = self.width() < self.NARROW
        if narrow != self._narrow:
            self._narrow = narrow
            self.chats_action.setChecked(not narrow)
        share = int(self.DOCK_SHARE * self.width())
        if self.dock.isVisible() and not self.dock.isFloating() and self.dock.width() > max(self.dock.minimumWidth(), share):
            # the window shrank: the plots give way too, so the transcript keeps the most of the room
            self.resizeDocks([self.dock], [max(self.dock.minimumWidth(), share)], Qt.Orientation.Horizontal)
        self._keep_chat_readable()

    READABLE_CHARS = 45  # the chat column holds at least this many characters a line

    def readable_width(self) -> int:
        return self.view.fontMetrics().averageCharWidth() * self.READABLE_CHARS + 48  # the bubbles' margins

    def _keep_chat_readable(self) -> None:
        """With the chat list open in a small window, the chat column keeps a readable width: the list narrows
        to its least, then the docked plots give way (hidden, with a line in the status bar; View > Live metrics
        shows them), and come back once there is room again (the list closed, the window wider)."""
        docked = not self.dock.isFloating()
        listed = self.sidebar.isVisibleTo(self)
        room = self.width() - (self.sidebar.width() if listed else 0)
        if listed and self.splitter.sizes()[0] > self.sidebar.minimumSizeHint().width() and docked and \
                self.dock.isVisible() and room - self.dock.width() < self.readable_width():
            least = max(self.sidebar.minimumSizeHint().width(), 150)
            self.splitter.setSizes([least, max(1, self.splitter.width() - least)])
            room = self.width() - least
        if listed and docked and self.dock.isVisible() and room - self.dock.minimumWidth() < self.readable_width():
            self._plots_gave_way = True
            self.dock.hide()
            self.statusBar().showMessage("Plots hidden to keep the chat readable", 8000)  # short: the bar is narrow
        elif self._plots_gave_way and (not listed or room - self.dock.minimumWidth() >= self.readable_width()):
            self._plots_gave_way = False
            self.dock.show()
            self.statusBar().clearMessage()

    def closeEvent(self, event) -> None:
        self.save_layout()
        self.bridge.shutdown()
        super().closeEvent(event)


def _error_turn(message: str):
    from specula.app.history import Turn

    return Turn("error", message)


def _load_fields(settings: Settings) -> dict:
    """What chooses the model or server: a change to these is saved only once it loaded."""
    from specula.app.settings_dialog import LOAD_KEYS

    return {key: getattr(settings, key) for key in LOAD_KEYS}


def _with(standard: QKeySequence.StandardKey, key: str) -> list[QKeySequence]:
    """The platform's keys for an action plus `key` (Linux desktops give Preferences no key at all)."""
    keys = QKeySequence.keyBindings(standard)
    return keys + [QKeySequence(key)] if QKeySequence(key) not in keys else keys
