"""Bench summary -> PNG charts: speedup by category, acceptance by draft position, accepted lengths.

Every chart is drawn from the summary dict alone (the one written to bench.json), so a chart shows
exactly the figures the JSON holds. matplotlib is imported inside the functions and drives its Agg
canvas directly, without pyplot: no GUI backend is ever chosen, so no Qt module is loaded. Each chart
function returns the data it drew, read back from the drawn artists where that is possible.
"""

from __future__ import annotations

from pathlib import Path

CHART_FILES = ("speedup.png", "acceptance_by_position.png", "accepted_length_histogram.png")
SIZE = (10, 5)  # inches
DPI = 120
BASELINE = "none"
_NONE_COLOUR = "#7f7f7f"
# matplotlib's tab10 without its grey, which marks the baseline
_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")


def strategy_colours(summary: dict) -> dict[str, str]:
    """One colour per strategy or peer, in the summary's order, the same in every chart."""
    colours = {}
    others = [n for n in summary["overall"] if n != BASELINE]
    for i, name in enumerate(others):
        colours[name] = _PALETTE[i % len(_PALETTE)]
    colours[BASELINE] = _NONE_COLOUR
    return colours


def _subtitle(summary: dict) -> str:
    model = str(summary["model"])
    if len(model) > 60:
        model = "..." + model[-57:]
    return (f"{model} | device {summary['device']} | dtype {summary['dtype']} | "
            f"max {summary['max_new_tokens']} new tokens")


def _figure(summary: dict, title: str, bars: int = 0):
    """A titled figure with one axes; wider than SIZE when there are many bars, so their labels stay
    legible."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    width = min(18.0, max(SIZE[0], 3.0 + 0.26 * bars))
    fig = Figure(figsize=(width, SIZE[1]), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title + "\n" + _subtitle(summary), fontsize=11)
    return fig, ax


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)


def _nothing_to_draw(fig, ax, path: Path, text: str) -> None:
    """Save the chart with only a note saying why it is empty."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555555")
    ax.set_xticks([])
    ax.set_yticks([])
    _save(fig, path)


def _drafting(summary: dict) -> list[str]:
    """Strategies that drafted tokens (plain decoding and the transformers peers do not report any)."""
    return [n for n, o in summary["overall"].items()
            if o.get("kind") != "peer" and o.get("per_position_acceptance")]


def speedup_series(summary: dict) -> tuple[list[str], dict[str, dict[str, float]]]:
    """Groups (categories in the summary's order, then "overall") and, per strategy or peer, the
    speedups over `none` that exist. `none` itself is the 1.0 reference line, not a bar."""
    groups: list[str] = []
    values: dict[str, dict[str, float]] = {}
    for row in summary["rows"]:
        if row["category"] not in groups:
            groups.append(row["category"])
        if row["strategy"] != BASELINE and row["speedup"] is not None:
            values.setdefault(row["strategy"], {})[row["category"]] = row["speedup"]
    groups.append("overall")
    for name, o in summary["overall"].items():
        if name != BASELINE and o["speedup"] is not None:
            values.setdefault(name, {})["overall"] = o["speedup"]
    order = [n for n in summary["overall"] if n in values]
    return groups, {n: values[n] for n in order}


def speedup_chart(summary: dict, path: Path) -> dict[str, dict[str, float]]:
    """Grouped bars: speedup over `none` per category and overall. Returns the drawn bar heights."""
    groups, series = speedup_series(summary)
    colours = strategy_colours(summary)
    fig, ax = _figure(summary, "Speedup over plain decoding (none)", bars=sum(len(v) for v in series.values()))
    drawn: dict[str, dict[str, float]] = {}
    if not series:
        _nothing_to_draw(fig, ax, path, "no speedups: run the bench with the strategy 'none' to compare against")
        return drawn
    width = 0.8 / len(series)
    many = len(series) * len(groups) > 24
    top = max(max(v.values()) for v in series.values())
    for i, (name, by_group) in enumerate(series.items()):
        kept = [g for g in groups if g in by_group]
        xs = [groups.index(g) - 0.4 + width * (i + 0.5) for g in kept]
        heights = [by_group[g] for g in kept]
        peer = summary["overall"][name].get("kind") == "peer"
        bars = ax.bar(xs, heights, width * 0.92, label=name + (" (transformers)" if peer else ""),
                      color=colours[name], hatch="//" if peer else None, edgecolor="white", linewidth=0.5)
        ax.bar_label(bars, labels=[f"{h:.2f}x" for h in heights], padding=2,
                     fontsize=7 if many else 8, rotation=90 if many else 0)
        drawn[name] = {g: float(patch.get_height()) for g, patch in zip(kept, bars.patches)}
    ax.axhline(1.0, color=_NONE_COLOUR, linestyle="--", linewidth=1, label="none = 1.00x", zorder=0)
    ax.axvline(len(groups) - 1.5, color="#bbbbbb", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(groups)), groups, rotation=25 if len(groups) > 6 else 0,
                  ha="right" if len(groups) > 6 else "center")
    ax.get_xticklabels()[-1].set_fontweight("bold")
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylim(0, max(1.2, top * (1.3 if many else 1.2)))
    ax.set_ylabel("speedup over none (wall time ratio)")
    ax.set_xlabel("category")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=9)
    _save(fig, path)
    return drawn


def acceptance_chart(summary: dict, path: Path) -> dict[str, list[float]]:
    """Lines: per-position acceptance of every drafting strategy. Returns the drawn y values."""
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    colours = strategy_colours(summary)
    fig, ax = _figure(summary, "Acceptance by draft position")
    drawn: dict[str, list[float]] = {}
    names = _drafting(summary)
    if not names:
        _nothing_to_draw(fig, ax, path, "no drafting strategy in this bench")
        return drawn
    for name in names:
        o = summary["overall"][name]
        rates = o["per_position_acceptance"]
        rate = o.get("acceptance_rate")
        label = name + (f" (overall {rate:.0%})" if rate is not None else "")
        (line,) = ax.plot(range(1, len(rates) + 1), rates, marker="o", color=colours[name], label=label,
                          clip_on=False)
        drawn[name] = [float(y) for y in line.get_ydata()]
    longest = max(len(v) for v in drawn.values())
    ax.set_xlim(0.7, longest + 0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(axis="y", color="#e5e5e5")
    ax.set_xlabel("draft position (1 = first drafted token of a step)")
    ax.set_ylabel("accepted / drafted at this position")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="best", frameon=False, fontsize=9)
    _save(fig, path)
    return drawn


def histogram_chart(summary: dict, path: Path) -> dict[str, list[int]]:
    """Grouped bars: how many verify steps kept 0, 1, 2, ... draft tokens. Returns the drawn counts."""
    from matplotlib.ticker import MaxNLocator

    colours = strategy_colours(summary)
    fig, ax = _figure(summary, "Draft tokens accepted per verify step")
    series = {n: summary["overall"][n].get("accepted_length_histogram") or [] for n in _drafting(summary)}
    series = {n: counts for n, counts in series.items() if sum(counts)}
    drawn: dict[str, list[int]] = {}
    if not series:
        _nothing_to_draw(fig, ax, path, "no drafting strategy in this bench")
        return drawn
    width = 0.8 / len(series)
    longest = max(len(c) for c in series.values())
    for i, (name, counts) in enumerate(series.items()):
        xs = [x - 0.4 + width * (i + 0.5) for x in range(len(counts))]
        steps = sum(counts)
        mean = sum(n * c for n, c in enumerate(counts)) / steps
        bars = ax.bar(xs, counts, width * 0.92, color=colours[name],
                      label=f"{name} ({steps} step{'s' if steps != 1 else ''}, mean {mean:.2f} kept)")
        drawn[name] = [int(round(p.get_height())) for p in bars.patches]
    ax.set_xticks(range(longest))
    ax.set_xlim(-0.6, longest - 0.4)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(axis="y", color="#e5e5e5")
    ax.set_axisbelow(True)
    ax.set_xlabel("draft tokens kept in the step (the target's own next token not counted)")
    ax.set_ylabel("verify steps")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(loc="best", frameon=False, fontsize=9)
    _save(fig, path)
    return drawn


def write_charts(folder: Path, summary: dict) -> list[Path]:
    """Write the three PNGs into `folder`. Raises ModuleNotFoundError when matplotlib is missing."""
    paths = [Path(folder) / name for name in CHART_FILES]
    for chart, path in zip((speedup_chart, acceptance_chart, histogram_chart), paths):
        chart(summary, path)
    return paths
