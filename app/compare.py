"""Compare with plain decoding: the last prompt again, first with strategy `none`, then with the current
strategy, with the same seed and settings, back to back; then both decode rates, the measured speedup
(the ratio of the two rates) and whether the outputs are the same token ids.

Two runs one after the other measure the machine as well as the strategy: another program busy during one
run and not the other moves their ratio (here 0.74-1.98x for a strategy that runs 1.45x on a quiet machine).
Each run reports what a plain step cost while it ran (its own plain samples); where the two differ by more
than DRIFT and by more than their samples' scatter, the card says so, and what the ratio would be at one speed.

Compare measures what the user's answer cost: neither run joins what the drafters learn from the model's answers,
and the strategy's run drafts as if the answer it re-creates had never been given (every version of the answer
and the plain run's answer are left out of the drafters' corpora for it). Without that a strategy that learns from
earlier answers (auto, suffix) drafted the whole answer from its own copy: 2.05x for an answer that streamed at 0.57x.

The result is a card in the transcript, not a turn of the conversation: it is not saved and not sent to
the model (switching conversations clears it). The runs feed the live plots like any answer.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from PySide6.QtCore import QObject, Signal

from specula.app.fit import drop_oldest, is_context_error
from specula.app.settings import Settings
from specula.engine.api.events import Failed, Finished, Started, Step  # plain dataclasses: no torch

PLAIN = "none"
DRIFT = 0.10  # the two runs' plain steps differing by more than this: the machine's speed changed between them ...
SURE = 3.0  # ... where the difference is also this many standard errors (not the samples' own scatter)


@dataclass(frozen=True)
class RunResult:
    """One side of a comparison."""

    strategy: str
    token_ids: tuple[int, ...]
    new_tokens: int
    tokens_per_s: float
    acceptance: float | None
    reason: str
    live: float | None = None  # the live speedup measured inside this run (what the dock and footer show)
    live_err: float | None = None
    plain_step_s: float | None = None  # what a plain step cost while this run went on (its own samples)
    plain_step_err: float | None = None  # ... its standard error
    text: str = ""

    @classmethod
    def of(cls, strategy: str, finished) -> RunResult:
        t = finished.totals
        return cls(strategy, tuple(finished.token_ids), t.new_tokens, t.tokens_per_s, t.acceptance_rate,
                   finished.reason, finished.speedup, finished.speedup_err, finished.plain_step_s,
                   finished.plain_step_err, finished.text)


@dataclass(frozen=True)
class Comparison:
    strategy: str  # the speculative side
    seed: int
    temperature: float
    plain: RunResult | None = None
    fast: RunResult | None = None
    running: str | None = None  # the strategy generating now
    error: str = ""  # why it ended early ("stopped" or the engine's message)
    dropped: int = 0  # oldest messages left out to fit the context window

    @property
    def done(self) -> bool:
        return self.plain is not None and self.fast is not None

    @property
    def speedup(self) -> float | None:
        """Measured: the speculative decode rate over the plain one."""
        if not self.done or self.plain.tokens_per_s <= 0 or self.fast.tokens_per_s <= 0:
            return None
        return self.fast.tokens_per_s / self.plain.tokens_per_s

    @property
    def slowdown(self) -> float | None:
        """How much slower a plain step ran during the second run than during the first (1: the same speed);
        None where a run took no plain samples (a short answer, a server)."""
        if not self.done or not self.plain.plain_step_s or not self.fast.plain_step_s:
            return None
        return self.fast.plain_step_s / self.plain.plain_step_s

    @property
    def steady(self) -> bool:
        """Whether both runs ran at one machine speed, as far as it is known: their plain steps within DRIFT of each
        other, or apart by less than SURE standard errors (a fast model's steps of a few milliseconds scatter)."""
        if self.slowdown is None or abs(self.slowdown - 1) <= DRIFT:
            return True
        errors = (self.plain.plain_step_err, self.fast.plain_step_err)
        if None in errors:  # a run with a single sample: its scatter is unknown
            return True
        apart = abs(self.fast.plain_step_s - self.plain.plain_step_s)
        return apart <= SURE * math.hypot(*errors)

    @property
    def at_one_speed(self) -> float | None:
        """The measured speedup with the second run brought to the first one's machine speed."""
        return None if self.speedup is None or self.slowdown is None else self.speedup * self.slowdown

    @property
    def identical(self) -> bool | None:
        return self.plain.token_ids == self.fast.token_ids if self.done else None

    @property
    def first_difference(self) -> int | None:
        """The index of the first token where the outputs part (None when identical or not done)."""
        if not self.done or self.identical:
            return None
        pairs = zip(self.plain.token_ids, self.fast.token_ids)
        return next((i for i, (a, b) in enumerate(pairs) if a != b),
                    min(len(self.plain.token_ids), len(self.fast.token_ids)))


class CompareController(QObject):
    running_changed = Signal(bool)
    finished = Signal(object)  # the final Comparison

    def __init__(self, bridge, view, plots, parent=None) -> None:
        super().__init__(parent)
        self.bridge, self.view, self.plots = bridge, view, plots
        self.card: Comparison | None = None
        self._index = -1  # the card's place in the transcript
        self._messages: tuple = ()
        self._answers: tuple[str, ...] = ()  # the answers the strategy's run leaves out (Compare re-creates them)
        self._settings: Settings | None = None
        self._request_id: int | None = None
        self._started = False
        self.chat_template = True  # the loaded model has one (else messages continue as plain text)

    @property
    def running(self) -> bool:
        return self.card is not None

    def start(self, messages: tuple, settings: Settings, answers: tuple[str, ...] = ()) -> bool:
        """Compare on these messages (ending with the user's); False when there is nothing to compare. `answers`:
        the text of every version of the user's answer to them, which the strategy's run must not draft from."""
        if self.running or not messages or messages[-1].role != "user":
            return False
        seed = settings.seed if settings.seed is not None else random.randrange(2**31)
        self._settings = replace(settings, seed=seed)
        self._messages = tuple(messages)
        self._answers = tuple(answers)
        self.card = Comparison(settings.strategy, seed, settings.temperature, running=PLAIN)
        self._index = self.view.add_card(self.card)
        self.running_changed.emit(True)
        self._send(PLAIN)
        return True

    def stop(self) -> None:
        if self.running:
            self.bridge.stop()

    def owns(self, event) -> bool:
        return self.running and event.request_id == self._request_id

    def on_event(self, event) -> None:
        match event:
            case Started():
                self._started = True
                run = self.card.running
                which = "1 of 2, plain decoding" if run == PLAIN else f"2 of 2, {run}"
                self.plots.begin(f"Compare, run {which}: these figures are the comparison's, not the chat's "
                                 "answer (its own are under it)")
            case Step():
                self.plots.add_step(event)
            case Finished():
                self.plots.finish(event)
                self._finished(event)
            case Failed():
                self._failed(event)

    # -- internals ----------------------------------------------------------------------------------
    def _send(self, strategy: str) -> None:
        from specula.app.chat import build_request

        self._started = False
        self._update(running=strategy)
        try:
            request = build_request(self._messages, replace(self._settings, strategy=strategy), token_probs=False,
                                    chat=self.chat_template, own_baseline=True, learn=False,
                                    leave_out=self._answers if strategy != PLAIN else ())
        except ValueError as exc:  # the engine's SpeculaError: a setting it refuses
            self._end(error=str(exc))
            return
        self._request_id = self.bridge.send(request)

    def _finished(self, finished) -> None:
        card = self.card
        if finished.reason == "cancelled":
            self._end(error="stopped")
        elif card.running == PLAIN:
            self._update(plain=RunResult.of(PLAIN, finished))
            if finished.text:
                self._answers += (finished.text,)
            self._send(card.strategy)
        else:
            self._update(fast=RunResult.of(card.strategy, finished))
            self._end()

    def _failed(self, failed) -> None:
        shorter = drop_oldest(self._messages) if not self._started and is_context_error(failed) else None
        if shorter is None:
            self._end(error=failed.message)
            return
        self._update(dropped=self.card.dropped + len(self._messages) - len(shorter))
        self._messages = shorter
        self._send(self.card.running)

    def _update(self, **changes) -> None:
        self.card = replace(self.card, **changes)
        self.view.update_card(self._index, self.card)

    def _end(self, error: str = "") -> None:
        self._update(running=None, error=error)
        card, self.card, self._request_id = self.card, None, None
        self.running_changed.emit(False)
        self.finished.emit(card)
