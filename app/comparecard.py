"""The comparison card's contents as rich text (Qt's HTML subset): a small table of the runs, the one speedup the
card stands by (comparison.py says which) with what it rests on, and whether the outputs are identical. Pure
functions of a `Comparison`."""

from __future__ import annotations

from html import escape

from specula.app.comparison import PLAIN, Comparison, RunResult
from specula.app.theme import OriginColours
from specula.engine.api.metrics import speedup_text

PLAIN_LABEL = "plain (none)"


def card_title(c: Comparison) -> str:
    return f"Compare: plain decoding vs {c.strategy}"


def card_html(c: Comparison, colours: OriginColours) -> str:
    mode = "greedy" if c.temperature == 0 else f"temperature {c.temperature:g}"
    times = "four times" if c.second_pair_why else "twice"
    lines = [_p(f"The last prompt, run {times} back to back: same seed ({c.seed}), {mode}, same settings.",
                colours.muted), _table(c, colours)]
    if c.done and c.running is not None:  # the second pair runs: the first one's figure is in doubt
        lines.append(_p(f"Running a second pair the other way round: {c.second_pair_why}.", colours.muted))
    elif c.done:
        lines.append(_verdict(c, colours))
        if c.error == "stopped":
            lines.append(_p("The second pair was stopped: the figure is the first pair's.", colours.muted))
    elif c.error == "stopped":
        lines.append(_p("Stopped.", colours.muted))
    elif c.error:
        lines.append(_p(escape(c.error), colours.error_text))
    if c.dropped:
        lines.append(_p(f"{c.dropped} earlier messages were left out to fit the context window.", colours.muted))
    return "".join(lines)


def _p(html: str, colour: str | None = None) -> str:
    """A paragraph with explicit margins, so it looks the same wherever in the bubble it lands."""
    style = "margin-top:6px; margin-bottom:0px;" + (f" color:{colour};" if colour else "")
    return f"<p style='{style}'>{html}</p>"


def _table(c: Comparison, colours: OriginColours) -> str:
    head = "".join(f"<th align='{a}' style='color:{colours.muted}'>{h}</th>"
                   for h, a in (("", "left"), ("tokens", "right"), ("tokens/s", "right"), ("acceptance", "right")))
    again = c.second_pair_why != ""
    rows = [_row(PLAIN_LABEL, c.plain, c.running == PLAIN and c.fast is None),
            _row(c.strategy, c.fast, c.running == c.strategy and c.plain is not None and c.fast is None)]
    if again:
        rows += [_row(f"{c.strategy} again", c.fast_again, c.running == c.strategy and c.fast is not None),
                 _row(f"{PLAIN_LABEL} again", c.plain_again, c.running == PLAIN and c.fast_again is not None)]
    return f"<table cellspacing='0' cellpadding='3' style='margin-top:6px'><tr>{head}</tr>{''.join(rows)}</table>"


def _row(label: str, run: RunResult | None, running: bool) -> str:
    if run is None:
        cells = ("running…" if running else "–", "", "")
    else:
        acceptance = "–" if run.acceptance is None else f"{run.acceptance:.0%}"
        cells = (str(run.new_tokens), f"{run.tokens_per_s:.1f}", acceptance)
    tds = "".join(f"<td align='right'>{cell}</td>" for cell in cells)
    return f"<tr><td>{escape(label)}&nbsp;&nbsp;</td>{tds}</tr>"


def _verdict(c: Comparison, colours: OriginColours) -> str:
    """The one figure the card stands by, in bold, then what it rests on, then whether the outputs are the same."""
    lines = [_p(_headline(c, colours)), _p(_evidence(c), colours.muted)]
    if c.identical:
        lines.append(_p(f"<span style='color:{colours.draft}'><b>✓ identical outputs</b></span> "
                        f"({len(c.plain.token_ids)} tokens)"))
        return "".join(lines)
    lines.append(_p(f"<span style='color:{colours.correction}'><b>outputs differ</b></span> "
                    f"from token {c.first_difference + 1}"))
    why = ("Sampling draws differently once drafts are verified; both answers follow the model's distribution."
           if c.temperature > 0 else
           "Greedy answers part where the model's top two tokens are nearly tied and the verify pass rounds "
           "differently from a one-token step (bf16); in fp32 they match.")
    return "".join(lines) + _p(why, colours.muted)


def _headline(c: Comparison, colours: OriginColours) -> str:
    if c.headline is not None:
        return f"<b>Speedup: <span style='color:{colours.bonus}'>{c.headline:.2f}×</span></b>"
    if c.unsteady:
        return f"<b style='color:{colours.error_text}'>Speedup: the machine's speed changed too much to say</b>"
    return "<b>Speedup: n/a</b> (too few tokens to time)"


def _evidence(c: Comparison) -> str:
    """What the headline rests on: the pairs' figures, the machine's speed where it changed, the live figure."""
    first = c.first_pair
    live = ("" if c.fast.live is None else
            f" The {c.strategy} run's own live figure: {speedup_text(c.fast.live, c.fast.live_err)}.")
    if c.second_pair is None:
        if first.figure is None:
            return live.strip()
        if first.steady:
            return (f"{c.fast.tokens_per_s:.1f} against {c.plain.tokens_per_s:.1f} tokens/s, the two runs at one "
                    f"machine speed.{live}")
        return (f"{_speeds(first)}: this is the ratio at one speed; as the runs went it measured "
                f"{first.speedup:.2f}×.{live} Compare again on a quiet machine for a cleaner figure.")
    second = c.second_pair
    tries = f"{first.figure:.2f}× and {second.figure:.2f}×" if second.figure is not None else f"{first.figure:.2f}×"
    opening = f"Run twice, the second pair the other way round, because {c.second_pair_why}: {tries} at one speed."
    if c.unsteady:
        return (f"{opening}{live} Another program changed the machine's speed while they ran; compare again on a "
                "quiet machine.")
    return f"{opening} The figure is their mean.{live}" if len(c.figures) == 2 else f"{opening}{live}"


def _speeds(pair) -> str:
    """The machine's speed changed between a pair's runs: by how much."""
    first, second = pair.plain.plain_step_s * 1000, pair.fast.plain_step_s * 1000
    change = "slower" if pair.slowdown > 1 else "faster"
    return (f"The machine ran {change} during the second run (a plain step took {first:.0f} ms in the first, "
            f"{second:.0f} ms in the second: another program at work?)")
