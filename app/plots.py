"""Live plots of one generation (pyqtgraph): acceptance per step and rolling, tokens/s against the
measured plain-decoding speed, live speedup, the accepted-length histogram and per-position acceptance.

Slots only append to ring buffers and update `specula.engine.api.metrics.LiveMetrics`; while a generation runs a
timer pushes the buffers into one plot at a time (each plot four times a second), so a burst of steps
costs one redraw and no single paint stalls the event loop for long: on a small machine the window shares
its cores with the engine, and every millisecond it paints is taken from the engine.

Connected to a server, the stream does not say what was drafted: acceptance comes from the server's
counters (`ServerStats`, a few a second), one point per reading over the interval since the previous one
and a cumulative line; the accepted-length histogram comes from the stream's chunks. The backend's notes
about these numbers show under the stats row.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPalette
from PySide6.QtWidgets import QGraphicsItem, QGridLayout, QLabel, QStackedLayout, QVBoxLayout, QWidget

from specula.app.ringbuffer import RingBuffer
from specula.app.theme import is_dark, mute, palette_for
from specula.engine.api.events import tokens_per_step
from specula.engine.api.metrics import speedup_text

REFRESH_MS = 50  # a tick refreshes one of the PARTS: each at 4 Hz
TITLE_SIZE = "9pt"
TITLE_MARGIN = 50  # a plot's width its title cannot use: the value axis and the margins
ROLLING = 16  # steps in the rolling acceptance
WARMUP = 3  # decode steps before rates are plotted: the first ones are mostly noise


@dataclass(frozen=True)
class Line:
    """A curve: series `y` against series `x`, in a colour of the token palette (an OriginColours field)."""

    name: str
    x: str
    y: str
    colour: str
    style: str = "solid"  # "solid", "dashed", or "dots" (points without a line)
    gaps: bool = False  # NaN values leave gaps (connect="finite")


@dataclass(frozen=True)
class Plot:
    """One plot of the dock: where it sits, its title, and what it draws: lines from the series (refreshed as a
    part of its own), or a bar chart (the "bars" part); its y axis fixed at 0-1.05, or growing in round steps over
    its lines' values (`grows`: the least top, and the value that stands for the data while there is none)."""

    key: str
    cell: tuple[int, int, int]  # row, column, columns spanned
    title: str
    lines: tuple[Line, ...] = ()
    grows: tuple[float, float] | None = None
    unity: bool = False  # a dotted line at 1.0
    bars: str = ""  # the colour of its bars (the token palette's), for a bar chart
    whole_x: bool = False  # an axis of whole numbers: at least 4 wide (10 for the steps)


PLOTS = (
    Plot("acceptance", (0, 0, 2), "Acceptance <span style='color:{c.draft}'>● per step &nbsp;━ last {n} steps</span>",
         (Line("acceptance", "step", "acceptance", "draft", "dots"), Line("rolling", "step", "rolling", "draft"))),
    Plot("tps", (1, 0, 2), "Tokens/s so far <span style='color:{c.bonus}'>━ speculative</span> &nbsp;"
                           "<span style='color:{c.muted}'>╍ plain</span>",
         (Line("tps", "tps_step", "tps", "bonus"), Line("baseline", "tps_step", "baseline", "muted", "dashed", gaps=True)),
         grows=(10, 10)),
    Plot("speedup", (2, 0, 2), "Speedup over plain decoding <span style='color:{c.muted}'>(┈ 1×)</span>",
         (Line("speedup", "speed_step", "speedup", "correction"),), grows=(1.5, 1), unity=True),
    Plot("lengths", (3, 0, 1), "Accepted per step", bars="draft", whole_x=True),
    Plot("positions", (3, 1, 1), "Acceptance by position", bars="bonus", whole_x=True),
)
PLOT = {plot.key: plot for plot in PLOTS}
SERVER_ACCEPTANCE = ("Acceptance, server counters <span style='color:{c.draft}'>● per reading &nbsp;━ since the "
                     "start</span>")  # the acceptance plot's title where a server's counters give it
PARTS = (*(plot.key for plot in PLOTS if plot.lines), "bars", "stats")  # what a tick refreshes, one at a time
SERIES = tuple(dict.fromkeys(name for plot in PLOTS for line in plot.lines for name in (line.x, line.y)))
EMPTY = ("The plots follow the selected chat. Send a message: its acceptance, tokens per second and speedup "
         "over plain decoding are drawn here as the answer streams.")
EARLIER = ("This answer is from an earlier session: acceptance is drawn from its tokens; its timings were not "
           "kept, so tokens/s and speedup are its totals.")
STATS = (("acceptance", "acceptance"), ("per_step", "tokens / step"), ("tps", "tokens / s"),
         ("plain", "plain tokens / s"), ("speedup", "speedup"))
# what each figure measures, and over which span: tokens/s ÷ plain tokens/s = speedup, as shown
TIPS = {
    "acceptance": "Draft tokens the model accepted, of all it was shown, in this answer.",
    "per_step": "New tokens per pass of the model in this answer (1.00 for plain decoding).",
    "tps": "This answer's speed: its tokens after the first, per second since the first (reading the prompt "
           "is not counted).",
    "plain": "What plain decoding (strategy none) does over the same tokens and the same span: tokens/s ÷ speedup. "
             "Measured inside the answer by its plain steps, so a busy machine slows both alike.",
    "speedup": "Plain decoding's time for this answer's tokens ÷ the time they took, over the same span as "
               "tokens/s; ± one standard error of the plain steps it was measured by. Exactly 1 where every step "
               "was plain (strategy none).",
}


class PlotsPanel(QWidget):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.series = {name: RingBuffer() for name in SERIES}
        self.metrics = None  # specula.engine.api.metrics.LiveMetrics, created when a generation starts
        self.baseline = None  # specula.engine.api.metrics.BaselineCost of the loaded model
        self.counters = False  # acceptance comes from a server's counters (server-wide), not from each step
        self._model_notes = ""  # the backend's notes about its numbers
        self._chat_note = ""  # what the plots shown now are, when it needs saying (an earlier session's answer)
        self.events: list = []  # the events of the generation drawn now, to draw it again later (see replay)
        self._recent: list[tuple[int, int]] = []  # (drafted, accepted) of the last ROLLING steps
        self._last_step = 0  # the latest step's number: where a server reading is plotted
        self._server_seen = (0, 0)  # (draft tokens, accepted) at the previous server reading
        self._stale: set[str] = set()  # PARTS with data the plots do not show yet
        self._next_part = 0
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self._tick)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(self._build_stats())
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        mute(self.notes, 8)
        self.notes.setVisible(False)
        layout.addWidget(self.notes)
        self.graphics = pg.GraphicsLayoutWidget()
        self.empty = QLabel(EMPTY)  # over the plots while they have nothing to show
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        mute(self.empty)
        self.empty.setMargin(24)
        self.empty.setAutoFillBackground(True)
        self.empty.setBackgroundRole(QPalette.ColorRole.Base)
        stack = QStackedLayout()
        stack.setStackingMode(QStackedLayout.StackingMode.StackAll)
        stack.addWidget(self.empty)
        stack.addWidget(self.graphics)
        layout.addLayout(stack, 1)
        self.empty.raise_()
        self._build_plots()

    def draw_ahead(self) -> None:
        """Draw the plots once under their note, while the model loads: pyqtgraph makes each axis's picture on
        its first paint (about 20 of them, tens of milliseconds), which the first answer would otherwise pay
        while the engine reads its prompt. Not for plots the user has hidden."""
        if self.isVisible():
            self.graphics.grab()

    def sizeHint(self):
        """A dock of about a third of a 1280-wide window; the transcript gets the rest (the user can widen it)."""
        from PySide6.QtCore import QSize

        return QSize(380, 600)

    # -- building -----------------------------------------------------------------------------------
    def _build_stats(self) -> QGridLayout:
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(0)
        self.stat_labels: dict[str, QLabel] = {}
        big = QFont(self.font())
        big.setPointSizeF(max(9.0, self.font().pointSizeF() * 1.35))
        big.setBold(True)
        for col, (key, caption) in enumerate(STATS):
            value = QLabel("–")
            value.setFont(big)
            value.setAlignment(Qt.AlignmentFlag.AlignCenter)
            name = QLabel(caption)
            name.setWordWrap(True)  # a narrow dock puts "plain tokens / s" on two lines
            name.setAlignment(Qt.AlignmentFlag.AlignCenter)
            mute(name, 8)
            value.setToolTip(TIPS[key])
            name.setToolTip(TIPS[key])
            grid.addWidget(value, 0, col)
            grid.addWidget(name, 1, col)
            self.stat_labels[key] = value
        return grid

    def _build_plots(self) -> None:
        g = self.graphics
        self.plots = {spec.key: g.addPlot(row=spec.cell[0], col=spec.cell[1], colspan=spec.cell[2],
                                          axisItems={"left": SparseAxis("left")}) for spec in PLOTS}
        for plot in self.plots.values():
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.setMouseEnabled(x=False, y=False)
            # the value axis keeps one width, room for four digits: left to fit its labels, it widened when the
            # first answer's tokens/s passed 99, and the whole layout of the five plots was drawn again while the
            # engine read the prompt (about 20 axes, tens of milliseconds the first answer paid)
            left = plot.getAxis("left")
            left.setStyle(autoExpandTextSpace=False,
                          tickTextWidth=max(QFontMetrics(left.font()).horizontalAdvance(t) for t in ("0000", "0.00")))
            for name in ("left", "bottom"):
                # an axis draws its grid lines across the plot, so every new point repaints it: kept as a
                # pixmap, it is repainted by a copy until its range or ticks change (a paint of the five
                # plots went from ~20 ms to a few, the longest stall of the event loop with it)
                plot.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        for spec in PLOTS:
            plot = self.plots[spec.key]
            if spec.grows is None:
                plot.setYRange(0, 1.05, padding=0)
            plot.setLimits(minXRange=4 if spec.whole_x else 10)  # whole numbers: no fractional ticks on short runs
            # ranges move in coarse steps (see _fit_ranges): redrawing the axes every frame costs the
            # GUI thread more than the curves, and the engine thread waits for the interpreter meanwhile
            plot.disableAutoRange()
        self._ranges: dict[str, tuple[float, float, float, float]] = {}
        self.curves, self.bars, self.unity = {}, {}, None
        for spec in PLOTS:
            plot = self.plots[spec.key]
            for line in spec.lines:
                dots = {"pen": None, "symbol": "o", "symbolSize": 5, "symbolPen": None} if line.style == "dots" else {}
                self.curves[line.name] = plot.plot(**dots)
            if spec.unity:
                self.unity = plot.addLine(y=1.0)
            if spec.bars:
                self.bars[spec.key] = pg.BarGraphItem(x=[], height=[], width=0.8)
                plot.addItem(self.bars[spec.key])
        self._apply_theme()

    def _apply_theme(self) -> None:
        """Colours from the palette (light or dark) and the token colours of the transcript."""
        base = self.palette().color(QPalette.ColorRole.Base)
        fg = self.palette().color(QPalette.ColorRole.Text)
        dark = is_dark(self)
        c = palette_for(dark)
        self.graphics.setBackground(base)
        self._titled_at = -1
        self._set_titles()
        for plot in self.plots.values():
            for axis in ("left", "bottom"):
                plot.getAxis(axis).setTextPen(fg)
                plot.getAxis(axis).setPen(QColor(fg.red(), fg.green(), fg.blue(), 90))
        for spec in PLOTS:
            for line in spec.lines:
                colour = getattr(c, line.colour)
                if line.style == "dots":
                    dots = QColor(colour)
                    self.curves[line.name].setSymbolBrush(dots.lighter(125) if dark else dots.lighter(150))
                else:
                    dash = {"style": Qt.PenStyle.DashLine} if line.style == "dashed" else {}
                    self.curves[line.name].setPen(pg.mkPen(colour, width=2, **dash))
            if spec.bars:
                self.bars[spec.key].setOpts(brush=QColor(getattr(c, spec.bars)), pen=None)
        self.unity.setPen(pg.mkPen(c.muted, style=Qt.PenStyle.DotLine))

    def _set_titles(self) -> None:
        """Each plot's title on one line where it fits the plot's width, else on two (its name over its key): a title
        wider than its plot widened the plots past a narrow dock, which then cut them and their titles off."""
        width = self.graphics.viewport().width()
        if width == self._titled_at:
            return
        self._titled_at = width
        fg, c = self.palette().color(QPalette.ColorRole.Text).name(), palette_for(is_dark(self))
        metrics = QFontMetrics(_title_font())
        for key, plot in self.plots.items():
            spec = PLOT[key]
            title = (SERVER_ACCEPTANCE if key == "acceptance" and self.counters else spec.title).format(c=c, n=ROLLING)
            room = width * spec.cell[2] / 2 - TITLE_MARGIN  # a plot spans one of the two columns, or both
            if metrics.horizontalAdvance(_plain(title)) > room:
                title = _two_lines(title)
            plot.setTitle(f"<span style='color:{fg}'>{title}</span>", size=TITLE_SIZE)
            plot.titleLabel.setMinimumWidth(0)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if hasattr(self, "plots"):
            self._set_titles()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "plots"):
            self._apply_theme()

    # -- slots --------------------------------------------------------------------------------------
    def set_model(self, loaded) -> None:
        """A model was loaded or a server connected (specula.engine.api.events.Loaded): its baseline, and for a server
        the notes on where its numbers come from."""
        self.baseline = loaded.baseline
        self.counters = loaded.capabilities.acceptance == "counters"
        self._model_notes = " ".join(loaded.notes)
        self._say(self._chat_note)  # what the plots show says so still (an earlier session's answer at start)
        self._apply_theme()

    def begin(self, label: str = "") -> None:
        """A generation starts: clear the plots. `label` says whose figures they are when they are not the
        chat's answer (a Compare run)."""
        from specula.engine.api.metrics import LiveMetrics

        self.metrics = LiveMetrics(self.baseline, window=ROLLING)
        for buffer in self.series.values():
            buffer.clear()
        self.events = []  # the note over the plots stays until there is something to draw (see _reveal)
        self._chat_note = label
        self._say(label)
        self._recent = []
        self._last_step = 0
        self._server_seen = (0, 0)
        self._stale = set(PARTS)
        self._timer.start()

    def _reveal(self) -> None:
        """Take the note off the plots: the first figures of a generation are here. Not at its start: drawing the
        four plots again costs the window tens of milliseconds, which would be taken from the prompt's reading."""
        if not self.empty.isHidden():
            self.empty.setVisible(False)

    def add_step(self, step) -> None:
        if self.metrics is None:
            self.begin()
        self._reveal()
        self.events.append(step)
        m = self.metrics
        m.add(step)
        self._last_step = step.step
        s = self.series
        if step.drafted:
            self._add_acceptance(step)
        if step.step >= WARMUP:
            s["tps_step"].append(step.step)
            # the lines are the figures beside them over the same span (the answer's decode steps so far), so each
            # line ends at its figure: tokens/s, and plain tokens/s = tokens/s ÷ the speedup measured in the answer
            # (one line under `none`); a gap until the answer has measured plain decoding, never a rate taken from
            # elsewhere
            tps = m.tokens_per_s
            s["tps"].append(tps)
            s["baseline"].append(tps / m.speedup if m.speedup and tps else np.nan)
        if m.speedup is not None and step.step >= WARMUP:
            s["speed_step"].append(step.step)
            s["speedup"].append(m.speedup)
        self._stale = set(PARTS)

    def _add_acceptance(self, step) -> None:
        """A step that drafted: its acceptance and the rolling acceptance of the last ROLLING such steps."""
        self._recent = (self._recent + [(step.drafted, step.accepted)])[-ROLLING:]
        s = self.series
        s["step"].append(step.step)
        s["acceptance"].append(step.accepted / step.drafted)
        s["rolling"].append(sum(a for _, a in self._recent) / sum(d for d, _ in self._recent))

    def add_server_stats(self, stats) -> None:
        """A server's counters since the reply started (specula.engine.api.events.ServerStats): a point for the
        acceptance over the interval since the previous reading (when drafts were counted in it) and
        the cumulative acceptance; the per-position bars and the acceptance figure follow them."""
        if self.metrics is None:
            self.begin()
        self._reveal()
        self.events.append(stats)
        self.metrics.add_server(stats)
        drafted, accepted = self._server_seen
        new_drafted, new_accepted = stats.draft_tokens - drafted, stats.accepted - accepted
        self._server_seen = (stats.draft_tokens, stats.accepted)
        if new_drafted > 0 and stats.acceptance_rate is not None:
            s = self.series
            s["step"].append(self._last_step)
            s["acceptance"].append(min(1.0, max(0.0, new_accepted / new_drafted)))
            s["rolling"].append(stats.acceptance_rate)
        self._stale = set(PARTS)

    def finish(self, finished=None) -> None:
        """The generation ended: draw the final state and stop the timer."""
        self._timer.stop()
        self._stale = set(PARTS)
        self.refresh(finished)

    # -- another chat selected ----------------------------------------------------------------------
    def clear(self) -> None:
        """Nothing to show (a chat with no answer yet): empty plots and the note that says what comes."""
        self.begin()
        self._timer.stop()
        self.metrics = None
        for label in self.stat_labels.values():
            label.setText("–")
        self.refresh()
        self.empty.setVisible(True)
        self.empty.raise_()

    def replay(self, events: list, finished) -> None:
        """Draw a generation again from its events (an answer made since the app started)."""
        self.begin()
        self._timer.stop()
        for event in events:
            (self.add_server_stats if hasattr(event, "draft_tokens") else self.add_step)(event)
        self.finish(finished)

    def show_tokens(self, records, totals: dict[str, str]) -> None:
        """An answer from an earlier session: accepted lengths and positions from its token records; its figures
        from its saved totals where they are (`totals`: tokens.totals_of its footer), so that they read as its
        footer does, else from the records."""
        self.begin()
        self._timer.stop()
        last = 1.0
        for step in _steps_of(records):
            self.metrics.add(step)
            last = max(last, float(step.step))
            if step.drafted and not step.inferred:
                self._add_acceptance(step)
        tps, speedup = _number(totals.get("tps")), _number(totals.get("speedup"))
        s = self.series
        for x in (1.0, last):  # its timings were not kept: its totals, drawn across the answer (they were left empty)
            if tps:
                s["tps_step"].append(x)
                s["tps"].append(tps)
                s["baseline"].append(tps / speedup if speedup else np.nan)
            if speedup:
                s["speed_step"].append(x)
                s["speedup"].append(speedup)
        self.refresh()
        self.stat_labels["tps"].setText(totals.get("tps") or "–")
        self.stat_labels["plain"].setText(f"{tps / speedup:.1f}" if tps and speedup else "–")  # as in _refresh_stats
        self.stat_labels["speedup"].setText(totals.get("speedup") or "–")
        for key in ("acceptance", "per_step"):
            if key in totals:
                self.stat_labels[key].setText(totals[key])
        self._chat_note = EARLIER
        self._say(EARLIER)

    def _say(self, text: str) -> None:
        """A line under the stats about what the plots show (or the backend's notes when it is empty)."""
        text = text or self._model_notes
        self.notes.setText(text)
        self.notes.setVisible(bool(text))

    def refresh(self, finished=None) -> None:
        """Push the buffers into every plot now (at the end of a generation, and in tests)."""
        for part in PARTS:
            self._refresh_part(part, finished)
        self._stale.clear()
        self._reveal()

    def _refresh_part(self, part: str, finished=None) -> None:
        if part == "bars":
            self._refresh_bars()
        elif part == "stats":
            self._refresh_stats(finished)
        else:
            self._refresh_lines(PLOT[part])

    def _refresh_lines(self, spec: Plot) -> None:
        """A line plot's curves from their series, and its range: the steps axis, and the y axis fixed or grown
        over the values drawn."""
        s = self.series
        for line in spec.lines:
            self.curves[line.name].setData(s[line.x].values(), s[line.y].values(), **({"connect": "finite"} if line.gaps else {}))
        top = 1.05
        if spec.grows is not None:
            least, stand_in = spec.grows
            values = np.concatenate([s[line.y].values() for line in spec.lines])
            values = values[np.isfinite(values)]
            top = _nice_ceil(1.15 * (values.max() if len(values) else stand_in), low=least)
        self._set_range(spec.key, 0, self._x_max(), 0, top)

    def _x_max(self) -> float:
        """The steps axis: covers the data and doubles when it fills up. An axis whose range changes is
        drawn again, ticks, labels and grid, which costs the GUI thread more than the curves; doubling
        keeps that to a handful of times per answer (at 32-step blocks it was three times a second)."""
        s = self.series
        steps = dict.fromkeys(line.x for plot in PLOTS for line in plot.lines)
        last_step = max((float(v.max()) for v in (s[k].values() for k in steps) if len(v)), default=0.0)
        return float(2 ** max(7, math.ceil(math.log2(max(last_step, 1.0)))))  # 128 steps hold most answers

    def _set_range(self, key: str, x0: float, x1: float, y0: float, y1: float) -> None:
        if self._ranges.get(key) != (x0, x1, y0, y1):
            self._ranges[key] = (x0, x1, y0, y1)
            self.plots[key].setRange(xRange=(x0, x1), yRange=(y0, y1), padding=0)

    def _tick(self) -> None:
        """One part per tick: each paint then covers one plot, so the event loop never stalls long."""
        for _ in PARTS:
            part = PARTS[self._next_part]
            self._next_part = (self._next_part + 1) % len(PARTS)
            if part in self._stale:
                self._stale.discard(part)
                self._refresh_part(part)
                return

    def _refresh_bars(self) -> None:
        m = self.metrics
        lengths = m.accepted_lengths if m is not None else []
        counts = np.bincount(np.asarray(lengths, dtype=int)) if lengths else np.zeros(0)
        self.bars["lengths"].setOpts(x=np.arange(counts.shape[0]), height=counts)
        rates = m.per_position if m is not None else []
        self.bars["positions"].setOpts(x=np.arange(1, len(rates) + 1), height=np.asarray(rates, dtype=float))
        self._set_range("lengths", -0.6, max(4, len(counts)) - 0.4, 0, _nice_ceil(max(counts, default=1) * 1.1, low=8))
        self._set_range("positions", 0.4, max(4, len(rates)) + 0.6, 0, 1.05)

    def _refresh_stats(self, finished=None) -> None:
        m = self.metrics
        if m is None:
            return
        # a finished answer's figures are its totals', as its footer gives them (tokens.summary)
        totals = finished.totals if finished is not None and finished.totals.target_forwards else None
        rate = totals.acceptance_rate if totals is not None else m.acceptance_rate
        # no figure for one token: it came with the prompt's pass ("0.50" where a second pass only ended the answer)
        per_step = tokens_per_step(totals) if totals is not None else m.mean_accepted_length if m.new_tokens > 1 else None
        tps = finished.totals.tokens_per_s if finished is not None else m.tokens_per_s
        speedup = finished.speedup if finished is not None else m.speedup
        error = finished.speedup_err if finished is not None else m.speedup_err
        # one definition: plain tokens/s is what makes tokens/s ÷ plain = the speedup shown (the speedup is
        # measured over the same decode span); only without a speedup does it come from the plain steps' rate
        plain = tps / speedup if tps and speedup else m.plain_rate(m.decode_start_len + max(0, m.new_tokens - 1) // 2)
        values = {
            "acceptance": f"{rate:.0%}" if rate is not None else "–",
            "per_step": f"{per_step:.2f}" if per_step is not None else "–",
            "tps": f"{tps:.1f}" if tps else "–",
            "plain": f"{plain:.1f}" if plain else "–",
            "speedup": speedup_text(speedup, error),
        }
        for key, text in values.items():
            self.stat_labels[key].setText(text)



class SparseAxis(pg.AxisItem):
    """A value axis whose labels never crowd: where a short plot (a small screen) would put its major ticks
    closer than MIN_PIXELS apart (pyqtgraph draws every major label, overlapping or not), they are spread to
    the next round spacing (1, 2 or 5 times a power of ten) that keeps them apart, without minor ticks."""

    MIN_PIXELS = 18  # a label's height and a little

    def tickSpacing(self, minVal, maxVal, size):  # noqa: N802, N803 - pyqtgraph's names
        levels = super().tickSpacing(minVal, maxVal, size)
        if not levels or maxVal <= minVal or size <= 0:
            return levels
        spacing = levels[0][0]
        if spacing / (maxVal - minVal) * size >= self.MIN_PIXELS:
            return levels
        wanted = self.MIN_PIXELS * (maxVal - minVal) / size
        power = 10.0 ** math.floor(math.log10(wanted))
        return [(next(m * power for m in (1, 2, 5, 10) if m * power >= wanted), 0)]


def _number(text: str | None) -> float | None:
    """The number a shown figure starts with ("126.2", "1.42× ±0.05", "~0.98×"); None for "–" or nothing."""
    head = (text or "").lstrip("~").split("×")[0].split()[0] if (text or "").strip() else ""
    try:
        return float(head)
    except ValueError:
        return None


def _steps_of(records) -> list:
    """A saved answer's token records as the step counts LiveMetrics reads (no timings: they were not kept)."""
    steps: dict[int, list] = {}
    for rec in records:
        steps.setdefault(rec.step, []).append(rec)
    return [SimpleNamespace(step=n, drafted=sum(r.origin in ("draft", "rejected") for r in recs),
                            accepted=sum(r.origin == "draft" for r in recs),
                            tokens=[r for r in recs if r.origin != "rejected"], elapsed_s=0.0, context_len=0,
                            speedup=None, speedup_err=None, plain_step_s=None, draft_s=0.0, verify_s=0.0,
                            inferred=any(r.inferred for r in recs))
            for n, recs in steps.items()]


def _nice_ceil(value: float, low: float) -> float:
    """The smallest of low, 1.5, 2, 3, 5 and 7.5 times a power of ten that holds `value`: a y range that
    changes only when the data outgrows it by a good margin, so the axis is seldom drawn again."""
    value = max(float(value), low)
    if not math.isfinite(value):
        return low
    scale = 10.0 ** math.floor(math.log10(value))
    return next(m * scale for m in (1, 1.5, 2, 3, 5, 7.5, 10) if m * scale >= value * (1 - 1e-9))


def _title_font() -> QFont:
    font = QFont()
    font.setPointSizeF(float(TITLE_SIZE.removesuffix("pt")))
    return font


def _plain(title: str) -> str:
    """A title's text without its markup, as it is drawn."""
    return re.sub(r"<[^>]+>", "", title).replace("&nbsp;", " ")


def _two_lines(title: str) -> str:
    """A title on two lines: its name over its key (before the key's first span), or split at its first space."""
    if " <span" in title:
        name, key = title.split(" <span", 1)
        return f"{name}<br><span{key}"
    return title.replace(" ", "<br>", 1)
