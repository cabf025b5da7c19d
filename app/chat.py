"""Conversations and replies: the history on disk, the transcript on screen and the requests sent.

The controller keeps the current conversation, turns a message into a `GenerateRequest` (the whole
conversation goes through the model's chat template) and turns the reply's events into tokens on
screen, points on the plots and, once it ends, a saved turn.

Regenerate drops what follows the last user message and answers it again; sending an edited message
replaces that message and drops everything after it. A prompt longer than the context window is sent
again without its oldest turns (`fit.py`) before the engine's error is shown.

Conversations live in `history_db.ConversationDB`. A save that fails (a read-only folder, a full disk, a
locked database) never stops the chat: everything stays on screen and in memory, `store_failed` says
what and where (the window shows it in a banner), and the unsaved conversations are written again every
few seconds and with the next save, until it works (`store_recovered`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from PySide6.QtCore import QObject, QTimer, Signal

from specula.app import background
from specula.app.fit import drop_oldest, dropped_note, fit_body, is_context_error, too_long
from specula.app.history import Conversation, TokenRecord, Turn, chat_messages, new_id
from specula.app.history_db import ConversationDB, StoreError
from specula.app.settings import Settings
from specula.app.tokens import step_records, summary, totals_of
from specula.engine.api.events import (  # plain dataclasses: no torch
    Failed,
    Finished,
    PromptProgress,
    ServerStats,
    Started,
    Step,
)


@dataclass
class Reply:
    """The answer being generated."""

    request_id: int
    conversation_id: str
    strategy: str
    messages: tuple = ()  # what was sent (fewer than the conversation when turns were left out)
    settings: Settings | None = None
    dropped: int = 0  # oldest messages left out to fit the context window
    tokens: list[TokenRecord] = field(default_factory=list)
    started: bool = False
    step: str = ""  # the decoding step it started on (Started.step): "compiling" means slower, eager
    reading: bool = False  # its long prompt is being read (the status bar says how far)
    saved_at: float = 0.0  # when the answer's text so far was last written (kept if the app dies)
    previous: Turn | None = None  # the answer being regenerated: kept as an earlier version of the new one
    model: str = ""  # the model that answers (its footer names it)

    @property
    def text(self) -> str:
        """The answer so far (rejected drafts are not part of it)."""
        return "".join(t.text for t in self.tokens if t.origin != "rejected")


class ChatController(QObject):
    generating_changed = Signal(bool)
    conversations_changed = Signal()
    reply_finished = Signal(bool, object)  # ok, the Finished or Failed event
    store_failed = Signal(str)  # a save failed: what and where (it is retried)
    store_recovered = Signal()  # every conversation is saved again
    step_notice = Signal(str)  # what the status bar says about the decoding step (being prepared, ready)
    reading = Signal(str)  # a long prompt being read (empty: it has been read)

    RETRY_MS = 5000
    BACKGROUND_TURNS = 400  # a chat with more turns than this (about 2 MB) is read off the GUI thread when it opens
    PARTIAL_EVERY_S = 2.0  # how often the text of an answer in progress is written

    def __init__(self, store: ConversationDB, bridge, view, plots, parent=None) -> None:
        super().__init__(parent)
        self.store, self.bridge, self.view, self.plots = store, bridge, view, plots
        self.conversations: dict[str, Conversation] = {}
        self.current_id: str | None = None
        self.reply: Reply | None = None
        self.unsaved: set[str] = set()  # conversations whose last save failed
        self.loaded: set[str] = set()  # conversations whose turns were read (the others are titles only)
        self.chat_template = True  # the loaded model has one (else messages continue as plain text)
        self.model_name = ""  # the loaded model, as an answer's footer names it
        self.undeleted: set[str] = set()  # conversations whose deletion failed
        # id -> [(an answer made in this session, its events, its Finished)], the latest RUNS_KEPT, so that any
        # version of them shown again (Alt+Left, another chat and back) is drawn from its events
        self.runs: dict[str, list[tuple]] = {}
        self._retry = QTimer(self)
        self._retry.setInterval(self.RETRY_MS)
        self._retry.timeout.connect(self._save_unsaved)
        self.turn_counts: dict[str, int] = {}  # turns per stored conversation (what reading it costs)
        self.opening: str | None = None  # a conversation being read in the background

    # -- conversations ------------------------------------------------------------------------------
    def load(self) -> list[str]:
        """Read the saved conversations; returns notices (files set aside, imports, a database that
        cannot be opened: then the chat runs from memory and saving is retried)."""
        try:
            found, notices = self.store.list_all()  # titles and dates: the turns are read when a chat opens
        except StoreError as exc:
            found, notices = [], [f"{exc}. New conversations are kept in memory and saved once it works."]
        self.conversations = {c.id: c for c in found}
        self.loaded = set()
        try:
            self.turn_counts = self.store.turn_counts()
        except StoreError:
            self.turn_counts = {}
        if found:
            self.select(found[0].id)
        else:
            self.new_conversation()
        return notices

    def search(self, text: str) -> dict[str, str]:
        """Conversation id -> the best matching snippet, best match first; {} when the search fails."""
        try:
            hits = self.store.search(text)
        except StoreError as exc:
            self.store_failed.emit(str(exc))
            return {}
        found: dict[str, str] = {}
        for cid, _, snippet in hits:
            if cid in self.conversations:
                found.setdefault(cid, snippet)
        return found

    def ordered(self) -> list[Conversation]:
        return sorted(self.conversations.values(), key=lambda c: c.updated, reverse=True)

    @property
    def current(self) -> Conversation:
        return self.conversations[self.current_id]

    def new_conversation(self) -> None:
        if self.current_id in self.loaded and not self.current.turns:
            self.select(self.current_id)  # the current one is still empty: reuse it (one being read is not)
            return
        conv = Conversation(new_id())
        self.conversations[conv.id] = conv
        self.loaded.add(conv.id)
        self.select(conv.id)
        self.conversations_changed.emit()

    def select(self, conversation_id: str) -> None:
        if conversation_id not in self.conversations or self.reply is not None:
            return
        self.current_id = conversation_id
        if conversation_id not in self.loaded and self.turn_counts.get(conversation_id, 0) > self.BACKGROUND_TURNS:
            self._open_in_background(conversation_id)
            return
        self.view.show_turns(self.full(conversation_id).turns)
        self._show_plots(self.current)

    def _show_plots(self, conversation: Conversation) -> None:
        """The plots follow the selected chat: its last answer, drawn again from its events when it was made
        in this session, else from its saved tokens; nothing yet says what will appear."""
        last = next((t for t in reversed(conversation.turns) if t.role == "assistant"), None)
        run = next((r for r in reversed(self.runs.get(conversation.id, [])) if _same_answer(r[0], last)), None)
        if last is None or not last.tokens:
            self.plots.clear()
        elif run is not None:
            self.plots.replay(run[1], run[2])
        else:
            self.plots.show_tokens(last.tokens, totals_of(last.summary))

    def _open_in_background(self, conversation_id: str) -> None:
        """A large chat: shown as opening while a thread reads it, so the window never waits for it."""
        self.view.show_opening()
        if self.opening == conversation_id:
            return
        self.opening = conversation_id
        path = self.store.path
        background.run(self, lambda: ConversationDB(path).load(conversation_id),  # a connection of its own
                       done=lambda result: self._on_read(conversation_id, result),
                       failed=self._on_read_failed, name="specula-open-chat")

    def _on_read_failed(self, exc: Exception) -> None:
        """A chat could not be read: the banner says why (opening it again tries again)."""
        self.opening = None
        self.store_failed.emit(str(exc))

    def _on_read(self, conversation_id: str, result: Conversation) -> None:
        """A chat read in the background: kept, and shown if it is still the one selected."""
        self.opening = None
        if conversation_id not in self.conversations:
            return  # deleted meanwhile
        self.store.adopt(result)
        self.conversations[conversation_id] = replace(result, title=self.conversations[conversation_id].title)
        self.loaded.add(conversation_id)
        if self.current_id == conversation_id and self.reply is None:
            self.view.show_turns(self.current.turns)
            self._show_plots(self.current)
        self.conversations_changed.emit()

    def full(self, conversation_id: str) -> Conversation:
        """A conversation with its turns (read now if they were not yet)."""
        if conversation_id not in self.loaded:
            try:
                self.conversations[conversation_id] = self.store.load(conversation_id)
                self.loaded.add(conversation_id)
            except StoreError as exc:  # shown without its turns; it is not written over
                self.store_failed.emit(str(exc))
        return self.conversations[conversation_id]

    def rename(self, conversation_id: str, title: str) -> None:
        conv = self.conversations.get(conversation_id)
        if conv is None or conv.title == title:
            return
        if conversation_id in self.loaded:
            self._put(replace(conv, title=title))
        else:  # its turns were never read: only the title changes
            self.conversations[conversation_id] = replace(conv, title=title)
            self._store("rename", conversation_id, title)
        self.conversations_changed.emit()

    def delete(self, conversation_id: str) -> None:
        if conversation_id not in self.conversations or self.reply is not None:
            return
        del self.conversations[conversation_id]
        self.unsaved.discard(conversation_id)
        self.runs.pop(conversation_id, None)
        if not self._store("delete", conversation_id):
            self.undeleted.add(conversation_id)
        if conversation_id == self.current_id:
            self.current_id = None
            remaining = self.ordered()
            if remaining:
                self.select(remaining[0].id)
            else:
                self.new_conversation()
        self.conversations_changed.emit()

    def _put(self, conv: Conversation) -> None:
        """Keep and save a conversation (an empty one is not written until it has a turn)."""
        self.conversations[conv.id] = conv
        if conv.turns:
            self._save(conv.id)

    def _save(self, conversation_id: str) -> bool:
        """Write a conversation (and any whose earlier save failed); False, with `store_failed`, on failure."""
        for cid in [conversation_id, *(self.unsaved - {conversation_id})]:
            conv = self.conversations.get(cid)
            if conv is not None and not self._store("save", conv):
                self.unsaved.add(cid)
                return False
            self.unsaved.discard(cid)
        for cid in list(self.undeleted):
            if not self._store("delete", cid):
                return False
            self.undeleted.discard(cid)
        if self._retry.isActive():
            self._retry.stop()
            self.store_recovered.emit()
        return True

    def _store(self, method: str, *args) -> bool:
        """One call to the store; a failure is reported, and retried by the timer (the answer in
        progress is not: its final save writes it whole)."""
        try:
            getattr(self.store, method)(*args)
        except StoreError as exc:
            if method in ("save", "delete", "begin_answer"):
                self._retry.start()
            self.store_failed.emit(str(exc))
            return False
        for notice in self.store.take_notices():  # a damaged database salvaged by this write
            self.store_failed.emit(notice)
        return True

    def _save_unsaved(self) -> None:
        """The retry timer: the conversations and deletions that failed, written again."""
        self._save(next(iter(self.unsaved), ""))

    def _add_turn(self, conversation_id: str, turn: Turn) -> None:
        self._put(self.conversations[conversation_id].with_turn(turn))

    # -- sending ------------------------------------------------------------------------------------
    def send(self, text: str, settings: Settings, replace_from: int | None = None) -> bool:
        """Send a user message with the current settings; False when it could not be sent. With
        `replace_from`, the message replaces that turn of the conversation and everything after it."""
        if self.reply is not None or not text.strip() or self.current_id not in self.loaded:
            return False  # (a chat still being opened takes messages once it is read)
        refused = too_long(text)
        if refused:  # never sent, never kept: it would break every later message of the chat
            self.view.add_turn(Turn("error", refused), transient=True)
            return False
        cid = self.current_id
        if replace_from is not None and 0 <= replace_from < len(self.current.turns):
            self._truncate(replace_from, save=False)
        user = Turn("user", text)
        # saved with the answer's first row (begin_answer), in one transaction: a kill between the two
        # would leave the message saved with nothing to say its answer was cut short
        self.conversations[cid] = self.conversations[cid].with_turn(user)
        self.view.add_turn(user)
        self.conversations_changed.emit()
        return self._generate(cid, settings)

    def last_user_index(self) -> int | None:
        turns = self.current.turns if self.current_id is not None else ()
        return next((i for i in range(len(turns) - 1, -1, -1) if turns[i].role == "user"), None)

    def regenerate(self, settings: Settings) -> bool:
        """Drop what followed the last user message and answer it again."""
        last = self.last_user_index()
        if self.reply is not None or last is None:
            return False
        turns = self.current.turns
        previous = turns[last + 1] if last + 1 < len(turns) and turns[last + 1].role == "assistant" else None
        self._truncate(last + 1, save=False)  # saved with the new answer's first row
        self.conversations_changed.emit()
        if not self._generate(self.current_id, settings):
            return False
        self.reply.previous = previous
        return True

    RUNS_KEPT = 8

    def _remember_run(self, conversation_id: str, turn: Turn, finished) -> None:
        runs = [r for r in self.runs.get(conversation_id, []) if not _same_answer(r[0], turn)]
        self.runs[conversation_id] = (runs + [(turn, list(self.plots.events), finished)])[-self.RUNS_KEPT:]

    def show_version(self, turn: Turn, step: int) -> bool:
        """Show the previous (-1) or next (+1) version of an answer; it is the one later messages send."""
        index = self.index_of(turn)
        if index is None or self.reply is not None or not turn.versions:
            return False
        shown = turn.showing(turn.version + step)
        if shown.version == turn.version:
            return False
        conv = self.current
        self.conversations[conv.id] = replace(conv, turns=conv.turns[:index] + (shown,) + conv.turns[index + 1 :])
        self._save(conv.id)
        self.view.show_turns(self.current.turns)
        self._show_plots(self.current)
        return True

    def index_of(self, turn: Turn) -> int | None:
        """The position of a turn (the same object the transcript shows) in the current conversation."""
        turns = self.current.turns if self.current_id is not None else ()
        return next((i for i, t in enumerate(turns) if t is turn), None)

    def last_prompt(self, system_prompt: str = "") -> tuple:
        """The conversation up to its last user message, as engine Messages (empty when there is none)."""
        last = self.last_user_index()
        if last is None:
            return ()
        return chat_messages(self.current.truncated(last + 1), system_prompt)

    def last_answers(self) -> tuple[str, ...]:
        """The text of every version of the answer to the last user message (none where it has none yet)."""
        last = self.last_user_index()
        turns = self.current.turns if last is not None else ()
        if last is None or last + 1 >= len(turns) or turns[last + 1].role != "assistant":
            return ()
        return tuple(t.content for t in turns[last + 1].all_versions if t.content)

    def _truncate(self, n: int, save: bool = True) -> None:
        conv = self.current.truncated(n)
        self.conversations[conv.id] = conv
        if save:
            self._save(conv.id)
        self.view.show_turns(conv.turns)

    def _generate(self, cid: str, settings: Settings) -> bool:
        messages = chat_messages(self.conversations[cid], settings.system_prompt)
        self.reply = Reply(0, cid, settings.strategy, messages, settings, model=self.model_name)
        if not self._submit():
            return False
        self.generating_changed.emit(True)
        return True

    def _submit(self) -> bool:
        """Send the reply's request; False (with the error in the chat) when the engine refuses it."""
        reply = self.reply
        try:
            request = build_request(reply.messages, reply.settings, chat=self.chat_template)
            fitting = fit_body(reply.messages, body_size(request))  # earlier messages too large to send with it
            if fitting != reply.messages:
                reply.dropped += len(reply.messages) - len(fitting)
                reply.messages = fitting
                request = build_request(reply.messages, reply.settings, chat=self.chat_template)
        except ValueError as exc:  # the engine's SpeculaError: a setting it refuses
            self.reply = None
            self._fail(reply.conversation_id, str(exc))
            return False
        reply.request_id = self.bridge.send(request)
        if not self._store("begin_answer", self.conversations[reply.conversation_id]):
            self.unsaved.add(reply.conversation_id)  # the message it answers is written by the retries
        return True

    def stop(self) -> None:
        if self.reply is not None:
            self.bridge.stop()

    def owns(self, event) -> bool:
        return self.reply is not None and event.request_id == self.reply.request_id

    # -- events -------------------------------------------------------------------------------------
    def on_event(self, event) -> None:
        """Started, Step, ServerStats (a server's counters), Finished or Failed of the current reply."""
        match event:
            case Started():
                self.reply.started = True
                self.reply.strategy = event.strategy
                self.step_changed(event.step)
                self.reply.step = event.step
                self.plots.begin()
                self.view.begin_answer(dropped_note(self.reply.dropped))
            case PromptProgress():
                self.reply.reading = True
                self.reading.emit(reading_text(event))
                self.view.show_reading(reading_text(event))  # in the answer's bubble too, where the user looks
            case Step():
                if self.reply.reading:
                    self.reply.reading = False
                    self.reading.emit("")
                records = step_records(event)
                self.reply.tokens.extend(records)
                self.view.append_tokens(records)
                self.plots.add_step(event)
                self._save_partial()
            case ServerStats():
                self.plots.add_server_stats(event)
            case Finished():
                self._finish(event)
            case Failed():
                self._failed(event)

    PREPARING = "Preparing this CPU's decoding step (once, a few minutes): slower until ready"
    PREPARING_TIP = ("The decoding step is being compiled for this CPU in the background, once per machine. Until "
                     "it is ready, answers run on the slower general-purpose step; their footers say so.")
    READY = "The decoding step for this CPU is ready: answers now run at full speed"

    def step_changed(self, step: str) -> None:
        """The decoding step answers start on (a load's, an answer's): its notice when it is being built or became ready."""
        if step == "compiling":
            self.step_notice.emit(self.PREPARING)
        elif step == "compiled" and self.last_step == "compiling":
            self.step_notice.emit(self.READY)
        self.last_step = step or self.last_step

    last_step = ""  # the decoding step the latest answer started on

    def _save_partial(self) -> None:
        """Every few seconds, the answer's text so far: kept (marked interrupted) if the app dies."""
        reply, now = self.reply, time.monotonic()
        if now - reply.saved_at >= self.PARTIAL_EVERY_S:
            reply.saved_at = now
            self._store("update_answer", self.conversations[reply.conversation_id], reply.text)

    def _finish(self, finished) -> None:
        reply, self.reply = self.reply, None
        turn = Turn("assistant", finished.text, tuple(reply.tokens), summary(reply.strategy, finished, reply.step, reply.model),
                    dropped_note(reply.dropped))
        if reply.previous is not None:
            turn = turn.replacing(reply.previous)
        if reply.started:
            self.view.end_answer(turn)
        else:  # cancelled before it started: nothing was shown
            self.view.add_turn(turn)
        self.plots.finish(finished)
        self._remember_run(reply.conversation_id, turn, finished)
        self._add_turn(reply.conversation_id, turn)
        self.generating_changed.emit(False)
        self.conversations_changed.emit()
        self.reply_finished.emit(True, finished)

    def _failed(self, failed) -> None:
        if self._retry_shorter(failed):
            return
        reply, self.reply = self.reply, None
        if reply.started:  # cut short: kept, shown, and left out of later prompts (with its question), as after a crash
            partial = Turn("assistant", reply.text, tuple(reply.tokens), f"{reply.strategy} · interrupted by an error",
                           dropped_note(reply.dropped), interrupted=True)
            if reply.previous is not None:
                partial = partial.replacing(reply.previous)
            self.view.end_answer(partial)
            self._add_turn(reply.conversation_id, partial)
            self.plots.finish()
            self._remember_run(reply.conversation_id, partial, None)
        elif reply.previous is not None:  # a regenerate that never started: the answer it replaced comes back
            self._add_turn(reply.conversation_id, reply.previous)
            self.view.add_turn(reply.previous)
        self._fail(reply.conversation_id, failed.message)
        self.generating_changed.emit(False)
        self.reply_finished.emit(False, failed)

    def _retry_shorter(self, failed) -> bool:
        """The prompt did not fit: send it again without the oldest turns, when any are left to drop."""
        reply = self.reply
        shorter = drop_oldest(reply.messages) if not reply.started and is_context_error(failed) else None
        if shorter is None:
            return False
        reply.dropped += len(reply.messages) - len(shorter)
        reply.messages = shorter
        if not self._submit():
            self.generating_changed.emit(False)
            self.reply_finished.emit(False, failed)
        return True

    def _fail(self, conversation_id: str, message: str) -> None:
        turn = Turn("error", message)
        self._add_turn(conversation_id, turn)
        self.view.add_turn(turn)


def build_request(messages: tuple, s: Settings, token_probs: bool = True, chat: bool = True, **config):
    """An engine GenerateRequest for these messages and settings (imports the engine: call it once a
    model is loaded); `token_probs`: each draft token's probabilities, for hovering it (a timed run leaves
    them out: they cost a softmax a step); `chat`: through the model's chat template (False for a base model,
    whose messages continue as plain text); `config`: more of DecodeConfig's fields."""
    from specula.engine.api.types import DecodeConfig, GenerateRequest

    config = DecodeConfig.for_strategy(s.strategy, s.k or None, temperature=s.temperature, top_k=s.top_k,
                                       top_p=s.top_p, adaptive_k=s.adaptive_k, max_new_tokens=s.max_new_tokens,
                                       seed=s.seed, token_probs=token_probs, **config)
    return GenerateRequest(messages, s.strategy, config, chat=chat, options=s.request_options())


def body_size(request) -> int:
    """The bytes of a GenerateRequest's JSON body as the engine process receives it."""
    import json

    from specula.engine.remote.client import generation_payload

    return len(json.dumps(generation_payload(request)[1]))


def first_answer(s: Settings):
    """An answer as the first ones will ask (the strategy and settings chosen), for the engine to run while
    the model loads, so that the first answer after a start runs at the speed of the next; None for a
    server, or settings that make no request (the answer that asks says why)."""
    if s.remote:
        return None
    try:
        return build_request((), s)
    except ValueError:
        return None


def _same_answer(a: Turn | None, b: Turn | None) -> bool:
    """The same answer, though perhaps another Turn object (a version shown again keeps its text, tokens and
    summary)."""
    return a is b or (a is not None and b is not None and a.content == b.content and a.summary == b.summary
                      and len(a.tokens) == len(b.tokens) and a.tokens == b.tokens)


def reading_text(event: PromptProgress) -> str:
    """The status bar while a long prompt is read: how far, and about how long the rest takes."""
    left = event.left_s
    rest = f", about {_duration(left)} left" if left is not None else ""
    return f"Reading the prompt: {event.done:,} of {event.total:,} tokens ({event.done / max(1, event.total):.0%}){rest}"


def _duration(seconds: float) -> str:
    seconds = max(1, round(seconds))
    return f"{seconds} s" if seconds < 90 else f"{round(seconds / 60)} min"
