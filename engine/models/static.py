"""Static steps: the lean forward's decoding step over a cache allocated once for the whole context, in a
few fixed shapes, so that a GPU can capture each shape as a CUDA graph and replay it every step.

A step of R real rows runs as `bucket(R)` rows (BUCKETS; never fewer than the runner's `floor`), the
extra rows padding. Everything a step needs arrives as tensors of fixed shape: the tokens, their
positions, the cache slots they are written to, which of the pass's rows each row sees (`ancestors`:
a chain's rows see the rows before them, a tree's rows their ancestors) and where the pass begins. Every
row attends over every slot of the cache with a mask (gpt-fast's way): the cache before `start`, its own
ancestors' slots, and slot 0 (so that a padding row is never left without a key). Padding rows write to
one scratch slot past the context, which no real row sees.

Exactness: a GPU picks its matrix kernels by the number of rows, so a row can round differently in a
pass of 8 rows than alone. With every step of an answer run in the same bucket (`floor` = the rows of
the longest verify pass, K_MAX + 1) and over the same keys (the whole cache), a single step and a verify
pass meet the same kernels, and speculation reproduces plain decoding bit for bit. Waiting on memory or
on launches, a GPU runs 32 rows in the time of one.

`StepGraphs` captures the buckets as CUDA graphs in a background thread after load; until a bucket is
captured (and where capture fails: one log line) the same step runs eagerly, with the same kernels.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..api.errors import first_line
from ..api.types import K_MAX
from ..decoding.tree import TokenTree
from .attention import capped_attention
from .block import after_attention, call, rms_norm
from .eager import project

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
FLOOR = K_MAX + 1  # rows of every step on a GPU: those of the longest chain pass
CONTEXT = 8192  # positions of the static cache unless the model's window is smaller (SPECULA_CONTEXT)


def static_context(window: int) -> int:
    """The positions a static cache holds: the model's window, at most SPECULA_CONTEXT (default CONTEXT)."""
    raw = os.environ.get("SPECULA_CONTEXT", "").strip()
    try:
        wanted = int(raw) if raw else CONTEXT
    except ValueError:
        log.warning("SPECULA_CONTEXT=%r is not a number of positions; using %d", raw, CONTEXT)
        wanted = CONTEXT
    return max(1, min(window, wanted))


def bucket(rows: int, floor: int = 1) -> int | None:
    """The smallest bucket holding `rows` rows and at least `floor`; None past the largest."""
    return next((b for b in BUCKETS if b >= max(rows, floor)), None)


@dataclass
class StepInputs:
    """One step's inputs, padded to its bucket's rows (R)."""

    tokens: torch.Tensor  # (R,) int64
    positions: torch.Tensor  # (R,) int64: rotary positions
    slots: torch.Tensor  # (R,) int64: cache slots written (padding rows: the scratch slot)
    ancestors: torch.Tensor  # (R, R) bool: row r sees row c's slot
    start: torch.Tensor  # (1,) int64: slots before it are the cache every real row sees

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.tokens, self.positions, self.slots, self.ancestors, self.start

    def to(self, device: torch.device) -> "StepInputs":
        return StepInputs(*(x.to(device) for x in self.tensors()))

    def copy_(self, other: "StepInputs") -> None:
        for mine, theirs in zip(self.tensors(), other.tensors()):
            mine.copy_(theirs)


def step_inputs(scratch: int, rows: int, tokens: torch.Tensor, start: int, device: torch.device,
                depths: torch.Tensor | None = None, ancestors: torch.Tensor | None = None) -> StepInputs:
    """A pass of len(tokens) rows from position `start` (a chain; or a tree, by its rows' depths and
    ancestors) as the inputs of a step of `rows` rows; padding rows write slot `scratch`."""
    t = tokens.shape[0]
    pad = rows - t
    tok = torch.zeros(rows, dtype=torch.long, device=device)
    tok[:t] = tokens
    pos = torch.zeros(rows, dtype=torch.long, device=device)
    pos[:t] = start + (torch.arange(t, device=device) if depths is None else depths.to(device))
    slots = torch.full((rows,), scratch, dtype=torch.long, device=device)
    slots[:t] = torch.arange(start, start + t, device=device)
    anc = torch.zeros((rows, rows), dtype=torch.bool, device=device)
    anc[:t, :t] = torch.ones((t, t), dtype=torch.bool).tril() if ancestors is None else ancestors
    anc[t:, t:] = torch.eye(pad, dtype=torch.bool, device=device)
    return StepInputs(tok, pos, slots, anc, torch.tensor([start], dtype=torch.long, device=device))


def _same(a: tuple, b: tuple) -> bool:
    """Two layouts name the same buffers (by identity) and the same kept layers."""
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


# held while any graph is recorded, and by every runner with graphs around its passes: no step's work
# reaches the GPU mid-capture, and one capture runs at a time (the thread-local capture mode allows other
# threads' calls, but not all of them)
RECORDING = threading.Lock()


@dataclass
class _Captured:
    replay: Callable[[], None]
    inputs: StepInputs  # the buffers the graph reads its inputs from
    out: torch.Tensor  # the buffer it writes its logits to
    layout: tuple  # the runner's buffers it reads and writes (kept alive with it)


def cuda_capture(step: Callable[[StepInputs], torch.Tensor], inputs: StepInputs, pool, stream):
    """One CUDA graph of `step` on `inputs`' buffers: (replay, output buffer, the memory pool to share)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        out = step(inputs)
    return graph.replay, out, graph.pool()


class StepGraphs:
    """A runner's step buckets as CUDA graphs, captured one after another in a background thread, smallest
    first (from the runner's floor up). `run` replays a bucket's graph once it is captured for the runner's
    current buffers; until then (and for good where capture fails: one log line) it returns None and the
    caller runs the same step eagerly. When the runner's buffers change (it keeps other layers' states for
    a head), the graphs are captured again."""

    WARMUP = 2  # eager runs of a bucket before its capture (libraries set themselves up outside the graph)
    capture = staticmethod(cuda_capture)  # (step, inputs, pool, stream) -> (replay, out, pool)

    def __init__(self, step: Callable[[StepInputs], torch.Tensor], idle: Callable[[int], StepInputs],
                 layout: Callable[[], tuple], buckets: tuple[int, ...], device: torch.device) -> None:
        self._step, self._idle, self._layout = step, idle, layout
        self.buckets = buckets
        self.device = device
        self._ready: dict[int, _Captured] = {}
        self._lock = threading.Lock()
        self.recording = RECORDING
        self._thread: threading.Thread | None = None
        self._again = False
        self._pool = None
        self.error: str | None = None
        self.closed = False

    def start(self) -> None:
        """Capture (again) in the background; returns at once."""
        with self._lock:
            if self.error is not None or self.closed:
                return
            self._ready = {}
            if self._thread is not None and self._thread.is_alive():
                self._again = True  # the running capture starts over when it notices
                return
            self._thread = threading.Thread(target=self._capture_all, name="specula-graphs", daemon=True)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the capture to end; whether every bucket is captured for the current buffers."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.captured == self.buckets

    @property
    def captured(self) -> tuple[int, ...]:
        layout = self._layout()
        return tuple(b for b, c in sorted(self._ready.items()) if _same(c.layout, layout))

    def _capture_all(self) -> None:
        try:
            with torch.inference_mode():  # as the runner's own steps run (the mode is the thread's own)
                self._capture_until_done()
            if self.captured:
                log.info("step graphs captured for %s rows", ", ".join(map(str, self.captured)))
        except Exception as exc:  # noqa: BLE001 - any failure leaves the eager step, said once
            self.error = first_line(exc)
            with self._lock:
                self._ready = {}
            log.warning("step graphs could not be captured (%s): steps run without them", self.error)

    def _capture_until_done(self) -> None:
        """Every bucket for the runner's current buffers; again from the start if they change meanwhile."""
        while True:
            layout = self._layout()
            stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
            for rows in self.buckets:
                if self._again or self.closed or not _same(layout, self._layout()):
                    break
                self._capture_one(rows, layout, stream)
            with self._lock:
                if self.closed or (not self._again and _same(layout, self._layout())):
                    return
                self._again = False
                self._ready = {}

    def _capture_one(self, rows: int, layout: tuple, stream) -> None:
        inputs = self._idle(rows)  # padding rows only: they write the scratch slot, which no real row reads
        context = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        if stream is not None:
            stream.wait_stream(torch.cuda.default_stream(self.device))  # the buffers as the runner left them
        with context:
            for _ in range(self.WARMUP):
                self._step(inputs)
        if stream is not None:
            stream.synchronize()
        with self.recording:
            replay, out, self._pool = self.capture(self._step, inputs, self._pool, stream)
        with self._lock:
            if not self._again:
                self._ready[rows] = _Captured(replay, inputs, out, layout)

    def run(self, rows: int, inputs: StepInputs) -> torch.Tensor | None:
        """The bucket's graph replayed on `inputs`: its output buffer (valid until its next replay), or None
        where it is not captured for the runner's current buffers (capture starts again if they changed)."""
        captured = self._ready.get(rows)
        if captured is None:
            return None
        if not _same(captured.layout, self._layout()):
            self.start()
            return None
        captured.inputs.copy_(inputs)
        captured.replay()
        return captured.out

    def close(self) -> None:
        self.closed = True
        with self._lock:
            self._ready = {}


def start_graphs(runner, floor: int) -> StepGraphs:
    """A runner's static steps of `floor` rows or more, captured as CUDA graphs in the background (started here)."""

    def idle(rows: int) -> StepInputs:  # a step of padding rows only (they write the scratch slot): what is captured
        return step_inputs(runner.max_len, rows, torch.zeros(0, dtype=torch.long), 0, runner.device)

    def buffers() -> tuple:  # what a captured step reads and writes, by identity, and the layers whose states it keeps
        c = runner.cache
        return (c.aux_layers, c.k, c.v, c.feat, c.aux, c.cos, c.sin)

    graphs = StepGraphs(lambda inp: static_step(runner, inp), idle, buffers,
                        tuple(b for b in BUCKETS if b >= floor) or BUCKETS[-1:], runner.device)
    graphs.start()
    return graphs


def forward_static(runner, tokens: torch.Tensor, last: int, tree: TokenTree | None, start: int, rows: int):
    """A pass after the prefill as a step of `rows` rows (models/static.py), through its graph where captured."""
    t = tokens.shape[0]
    host = torch.device("cpu")  # the inputs are made on the host, then copied to the device
    depths, ancestors = (None, None) if tree is None else (tree.depths(host), tree.ancestors(host))
    inputs = step_inputs(runner.max_len, rows, tokens, start, host, depths, ancestors)
    replayed = runner.graphs.run(rows, inputs) if runner.graphs is not None else None
    if replayed is not None:
        logits = replayed[t - last : t].clone()  # the graph writes its buffer again at its next replay
    else:
        logits = static_step(runner, inputs.to(runner.device))[t - last : t]
    runner.cache.held(start + t)
    return logits

def static_step(runner, inp: StepInputs) -> torch.Tensor:
    """The layer loop of one step of fixed shape over the static cache: writes the rows' keys, values,
    features (and kept layers' states) to their slots; fp32 logits of every row (R, V). Tensor operations
    of fixed shapes only, without a host synchronisation: a CUDA graph can record it."""
    rows = inp.tokens.shape[0]
    cache = runner.cache
    keys = cache.k.shape[2]
    h, kv, hd = runner.n_heads, runner.n_kv, runner.head_dim
    x = runner.embed(inp.tokens)
    cos, sin = cache.cos[:, inp.positions], cache.sin[:, inp.positions]
    # row r sees the slots before `start`, its ancestors' slots in this pass (in a sliding-window layer those
    # within the window of its position), and slot 0 where it sees nothing else (a padding row)
    allowed = (torch.arange(keys, device=x.device) < inp.start).expand(rows, keys).clone()
    allowed.scatter_(1, inp.slots.expand(rows, rows), inp.ancestors)
    masks = {}
    for window in runner.windows:
        seen = allowed
        if window:
            seen = seen & (torch.arange(keys, device=x.device)[None, :] > inp.positions[:, None] - window)
        seen = seen.clone()
        seen[:, 0] |= ~seen.any(1)
        masks[window] = seen.repeat(runner.groups, 1)  # (groups*R, keys): grouped queries as extra rows of their KV head
    for i, layer in enumerate(runner.layers):
        if i in cache.aux_layers:
            cache.aux[:, cache.aux_layers.index(i)].index_copy_(0, inp.slots, x)
        q, k, v = project(runner, layer, rms_norm(x, layer.norms["attn_in"]), cos, sin, call)
        cache.k[i].index_copy_(1, inp.slots, k)
        cache.v[i].index_copy_(1, inp.slots, v)
        if runner.softcap:
            out = capped_attention(q, cache.k[i], cache.v[i], masks[layer.window][:rows], runner.scale, runner.softcap)
        else:
            out = F.scaled_dot_product_attention(q.reshape(kv, runner.groups * rows, hd), cache.k[i], cache.v[i],
                                                 attn_mask=masks[layer.window], scale=runner.scale).view(h, rows, hd)
        x = after_attention(runner, layer, x, layer.o_proj(out.transpose(0, 1).reshape(rows, -1)), call)
    cache.feat.index_copy_(0, inp.slots, x)
    return runner.scaled(runner.lm_head(rms_norm(x, runner.norm)).float())
