"""The comparison card's contents as rich text (Qt's HTML subset): a small table of the two runs, the
measured speedup and whether the outputs are identical. Pure functions of a `Comparison`."""

from __future__ import annotations

from html import escape

from specula.app.compare import Comparison, RunResult
from specula.app.theme import OriginColours
from specula.engine.api.metrics import speedup_text

PLAIN_LABEL = "plain decoding (none)"
GAP = "&nbsp;&nbsp;·&nbsp;&nbsp;"


def card_title(c: Comparison) -> str:
    return f"Compare: plain decoding vs {c.strategy}"


def card_html(c: Comparison, colours: OriginColours) -> str:
    mode = "greedy" if c.temperature == 0 else f"temperature {c.temperature:g}"
    lines = [_p(f"The last prompt, run twice back to back: same seed ({c.seed}), {mode}, same settings.",
                colours.muted), _table(c, colours)]
    if c.done:
        lines.append(_verdict(c, colours))
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
    rows = [_row(PLAIN_LABEL, c.plain, c.running == "none"),
            _row(c.strategy, c.fast, c.running == c.strategy and c.plain is not None)]
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
    speedup = "n/a (too few tokens to time)" if c.speedup is None else f"{c.speedup:.2f}×"
    head = f"<b>Measured speedup: <span style='color:{colours.bonus}'>{speedup}</span></b>{GAP}"
    if c.fast.live is not None:  # the same run's own figure, as the dock and the footer show it
        head += f"live in the answer: {speedup_text(c.fast.live, c.fast.live_err)}{GAP}"
    drift = "" if c.steady else _p(_drift(c), colours.error_text)
    if c.identical:
        same = (f"<span style='color:{colours.draft}'><b>✓ identical outputs</b></span> "
                f"({len(c.plain.token_ids)} tokens)")
        return _p(head + same) + drift
    differ = (f"<span style='color:{colours.correction}'><b>outputs differ</b></span> "
              f"from token {c.first_difference + 1}")
    why = ("Sampling draws differently once drafts are verified; both answers follow the model's distribution."
           if c.temperature > 0 else
           "Greedy answers part where the model's top two tokens are nearly tied and the verify pass rounds "
           "differently from a one-token step (bf16); in fp32 they match.")
    return _p(head + differ) + drift + _p(why, colours.muted)


def _drift(c: Comparison) -> str:
    """The machine's speed changed between the runs: by how much, and the ratio at one speed."""
    first, second = c.plain.plain_step_s * 1000, c.fast.plain_step_s * 1000
    change = "slower" if c.slowdown > 1 else "faster"
    return (f"The machine ran {change} during the second run (a plain step took {first:.0f} ms in the first, "
            f"{second:.0f} ms in the second: another program at work?), so the measured speedup is not the "
            f"strategy's alone. At one speed it would be about {c.at_one_speed:.2f}×. Compare again on a quiet "
            "machine for a clean figure.")
