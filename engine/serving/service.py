"""The engine's worker thread (`worker.Worker`) seen from asyncio.

The worker serves requests one at a time, in arrival order; its events come back on its thread and are
handed to the event loop, into one queue per request. The counters for /metrics are kept here, on the
event loop's thread, from the same events. The routes ask it, not the worker, what the loaded model's own
sampling defaults are and which decoding step answers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from ..api.events import Failed, Finished, Loaded, Loading, Origin, Started, Step
from ..api.metrics import SpeedupSum, StepTotals
from ..api.types import GenerateRequest, LoadRequest, RemoteLoadRequest, TrainRequest
from .openai import model_sampling
from .worker import Worker

if TYPE_CHECKING:
    from ..models.loading import LoadedModel


@dataclass
class Counters:
    """Since the server started; vLLM's spec-decode counters count the same things (see prometheus.py)."""

    requests: dict[str, int] = field(default_factory=dict)  # finished, by reason
    prompt_tokens: int = 0
    generation_tokens: int = 0
    counts: StepTotals = field(default_factory=StepTotals)  # decode steps (target forwards after the prefill)
    tokens_by_origin: dict[str, int] = field(
        default_factory=lambda: {o.value: 0 for o in Origin if o != Origin.REJECTED})
    rejected_tokens: int = 0
    decode_s: float = 0.0  # wall time after the first token, over finished requests
    decoded_tokens: int = 0  # tokens after the first, over finished requests
    # the live speedup (docs/ENGINE.md) summed over finished requests: plain decoding's time for their
    # tokens and the time they took; the ratio of two increases is the speedup over that interval
    speedup: SpeedupSum = field(default_factory=SpeedupSum)
    plain_step_s: float | None = None  # the latest measured cost of a plain step

    def add_step(self, step: Step) -> None:
        for token in step.tokens:
            self.tokens_by_origin[token.origin.value] = self.tokens_by_origin.get(token.origin.value, 0) + 1
        self.generation_tokens += len(step.tokens)
        self.rejected_tokens += len(step.rejected)
        if step.step == 0:
            return
        self.counts.add(step)
        if step.plain_step_s is not None:
            self.plain_step_s = step.plain_step_s

    def add_finished(self, finished: Finished, reason: str | None = None) -> None:
        """A request ended; `reason` where it is not the engine's (a stop sequence's cancel is a "stop")."""
        reason = reason or finished.reason
        self.requests[reason] = self.requests.get(reason, 0) + 1
        self.decode_s += finished.totals.decode_s
        self.decoded_tokens += max(0, finished.totals.new_tokens - 1)
        self.speedup.add(finished.speedup, finished.speedup_err, finished.totals.decode_s)


class EngineService:
    """Begin engine requests from the event loop and read their events from per-request queues."""

    def __init__(self, worker: Worker | None = None, on_load_failure: Callable[[str], None] | None = None) -> None:
        """`on_load_failure(message)`: told of each load that failed (`specula serve` prints it to its terminal)."""
        self.worker = worker or Worker()
        self.worker.sink = self._from_worker
        self.on_load_failure = on_load_failure
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loaded: Loaded | None = None
        self.state = "empty"  # empty (no model asked for yet), loading, ready, failed
        self.message = ""
        self.counters = Counters()
        self.waiting: set[int] = set()  # generation requests submitted, not yet started
        self.running: int | None = None
        self.started_at = time.time()
        self._queues: dict[int, asyncio.Queue] = {}
        self._ended: set[int] = set()  # requests whose last event came (Finished, Failed or Loaded)
        self._stopped: set[int] = set()  # answers a stop sequence ended (cancelled in the engine): "stop" in /metrics
        self._load_id: int | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop(timeout=5.0)

    # ---- the worker's side ---------------------------------------------------------------------------

    def _from_worker(self, event) -> None:
        """Called on the worker thread: hand the event to the event loop."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event) -> None:
        rid = event.request_id
        if isinstance(event, Started):
            self.waiting.discard(rid)
            self.running = rid
            self.counters.prompt_tokens += event.prompt_tokens
        elif isinstance(event, Step):
            self.counters.add_step(event)
        elif isinstance(event, Finished):
            self.counters.add_finished(event, "stop" if rid in self._stopped else event.reason)
            self._done(rid)
        elif isinstance(event, Failed):
            self._done(rid)
            if rid == self._load_id and self.on_load_failure is not None:
                self.on_load_failure(event.message)
            if rid == self._load_id and self.loaded is None:
                self.state, self.message = "failed", event.message
            elif rid == self._load_id:  # the model loaded before still answers: say so beside the failure
                self.state = "ready"
                self.message = f"the last load failed ({event.message}); {self.loaded.target} still answers"
        elif isinstance(event, Loading) and rid == self._load_id:
            self.state, self.message = "loading", event.message
        elif isinstance(event, Loaded):
            self.loaded = event
            if rid == self._load_id or self.state != "loading":
                self.state, self.message = "ready", ""
        if isinstance(event, (Finished, Failed, Loaded)) and rid in self._queues:
            self._ended.add(rid)
        queue = self._queues.get(rid)
        if queue is not None:
            queue.put_nowait(event)

    def _done(self, rid: int) -> None:
        self.waiting.discard(rid)
        self._stopped.discard(rid)
        if self.running == rid:
            self.running = None

    # ---- the event loop's side -----------------------------------------------------------------------

    def begin(self, request: GenerateRequest | LoadRequest | RemoteLoadRequest | TrainRequest
              ) -> tuple[int, asyncio.Queue]:
        """Begin a request (queued on the worker): its id, and the queue its events arrive in. Call on the event
        loop's thread (so the queue exists before the first event is delivered)."""
        rid = self.worker.submit(request)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = queue
        if isinstance(request, GenerateRequest):
            self.waiting.add(rid)
        elif isinstance(request, (LoadRequest, RemoteLoadRequest)):
            self._load_id = rid
            self.state, self.message = "loading", "queued"
        return rid, queue

    def release(self, rid: int) -> None:
        """The caller reads no more of this request's events: cancel it if it has not ended (a client
        that went away), before the engine's next step."""
        if self._queues.pop(rid, None) is not None and rid not in self._ended:
            self.worker.cancel(rid)
            self.waiting.discard(rid)  # nobody waits for it: it no longer counts against the queue's bound
        self._ended.discard(rid)

    def stop_sequence(self, rid: int) -> bool:
        """End a running answer at a stop sequence: cancelled in the engine, counted as stopped ("stop")."""
        self._stopped.add(rid)
        return self.cancel(rid)

    def cancel(self, rid: int) -> bool:
        """Cancel a queued or running request (a generation or a training run); False when there is
        none with that id. Its stream still ends with its last event (Finished "cancelled" or Failed)."""
        if rid in self._queues and rid not in self._ended:
            self.worker.cancel(rid)
            self.waiting.discard(rid)  # a queued one is skipped when its turn comes: it no longer holds a place
            return True
        return False

    # ---- what the routes ask -------------------------------------------------------------------------

    @property
    def sampling_defaults(self) -> tuple[tuple[str, float], ...]:
        """The loaded model's own sampling defaults (a local model's generation_config, read by
        openai.model_sampling); none for a relayed server, which applies its own."""
        model = getattr(self._local_model, "model", None)
        return model_sampling(getattr(model, "generation_config", None))

    @property
    def step_status(self) -> str | None:
        """Which decoding step answers (the eager and the compiled one round differently, so a greedy answer's text
        may differ between them: docs/ENGINE.md, "Which step answers"); None for a relayed server or no model."""
        target = self._local_model
        return None if target is None else target.step_status

    @property
    def _local_model(self) -> LoadedModel | None:
        """The loaded model that answers here, or None where a relayed server answers or no model is loaded."""
        worker = self.worker
        if self.loaded is None or worker.backend is not worker.session:
            return None
        return worker.session.target

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def expected_wait_s(self) -> int:
        """About how long the requests waiting now will take, for a busy answer's Retry-After: their number
        (and the running one) times the mean answer's time so far; 1 to 60 seconds."""
        answers = sum(self.counters.requests.values())
        mean = self.counters.decode_s / answers if answers else 1.0
        return max(1, min(60, round((self.queue_depth + 1) * mean)))

