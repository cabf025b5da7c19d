"""Compare with plain decoding: the last prompt again, first with strategy `none`, then with the current
strategy, with the same seed and settings, back to back (and, where the first pair's figure is in doubt, a second
pair the other way round: comparison.py); then the decode rates, the one speedup the card stands by, and whether the
outputs are the same token ids.

Compare measures what the user's answer cost: no run joins what the drafters learn from the model's answers, and
the strategy's runs draft as if the answer they re-create had never been given (every version of the answer and the
plain run's answer are left out of the drafters' corpora for them). Without that a strategy that learns from earlier
answers (auto, suffix) drafted the whole answer from its own copy: 2.05x for an answer that streamed at 0.57x.

The result is a card in the transcript, not a turn of the conversation: it is not saved and not sent to
the model (switching conversations clears it). The runs feed the live plots like any answer.
"""

from __future__ import annotations

import random
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from specula.app.comparison import PLAIN, Comparison, RunResult  # noqa: F401 - RunResult: part of this module's face
from specula.app.fit import drop_oldest, is_context_error
from specula.app.settings import Settings
from specula.engine.api.events import Failed, Finished, Started, Step  # plain dataclasses: no torch

SLOTS = ("plain", "fast", "fast_again", "plain_again")  # the runs' order: a second pair the other way round


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
        self._slot = 0  # which of SLOTS runs now
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
        self._send(0)
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
                total = 2 if self._slot < 2 else 4
                which = f"{self._slot + 1} of {total}, " + ("plain decoding" if run == PLAIN else run)
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
    def _send(self, slot: int) -> None:
        from specula.app.chat import build_request

        self._slot, self._started = slot, False
        strategy = PLAIN if SLOTS[slot].startswith("plain") else self.card.strategy
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
        if finished.reason == "cancelled":
            self._end(error="stopped")
            return
        slot = self._slot
        self._update(**{SLOTS[slot]: RunResult.of(self.card.running, finished)})
        if slot == 0 and finished.text:
            self._answers += (finished.text,)
        why = self.card.wants_second_pair() if slot == 1 else ""
        if why:
            self._update(second_pair_why=why)
        if slot in (0, 2) or why:
            self._send(slot + 1)
        else:
            self._end()

    def _failed(self, failed) -> None:
        shorter = drop_oldest(self._messages) if not self._started and is_context_error(failed) else None
        if shorter is None:
            self._end(error=failed.message)
            return
        self._update(dropped=self.card.dropped + len(self._messages) - len(shorter))
        self._messages = shorter
        self._send(self._slot)

    def _update(self, **changes) -> None:
        self.card = replace(self.card, **changes)
        self.view.update_card(self._index, self.card)

    def _end(self, error: str = "") -> None:
        self._update(running=None, error=error)
        card, self.card, self._request_id = self.card, None, None
        self.running_changed.emit(False)
        self.finished.emit(card)
