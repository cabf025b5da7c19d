"""Engine events -> what the transcript shows: token records in display order, hover text, summaries.

Pure functions over the frozen events (no Qt, no torch), so they are easy to test and reuse.
"""

from __future__ import annotations

from specula.app.history import TokenRecord
from specula.engine.api.events import tokens_parts, tokens_per_step
from specula.engine.api.metrics import speedup_part

ORIGIN_NAMES = {
    "draft": "accepted draft token",
    "correction": "the model's correction (replaced a rejected draft token)",
    "bonus": "the model's bonus token (every draft token was accepted)",
    "target": "the model's own token (nothing drafted)",
    "rejected": "rejected draft token (not part of the answer)",
}


INFERRED = "inferred from the server's stream chunks (the last token of a chunk is the model's own, the ones " \
           "before it drafts the server accepted)"


def record(token, inferred: bool = False) -> TokenRecord:
    """An specula.engine.api.events.Token as a plain record."""
    return TokenRecord(token.text, token.origin.value, token.step, token.draft_pos, token.p, token.q, token.branch,
                       inferred, token.drafter)


def step_records(step) -> list[TokenRecord]:
    """A Step's tokens in reading order: accepted drafts, then the rejected drafts (ghost text) at the
    point where they were rejected, then the model's own token (its correction or bonus)."""
    tokens = [record(t, step.inferred) for t in step.tokens]  # a server's step: origins inferred from its chunk
    drafts = [t for t in tokens if t.origin == "draft"]
    others = [t for t in tokens if t.origin != "draft"]
    return drafts + [record(t) for t in step.rejected] + others


def tooltip(rec: TokenRecord) -> str:
    """Rich text for hovering a token."""
    lines = [f"<b>{_escape(repr(rec.text))}</b>", ORIGIN_NAMES.get(rec.origin, rec.origin)]
    where = "prefill" if rec.step == 0 else f"step {rec.step}"
    if rec.draft_pos is not None:
        where += f", draft position {rec.draft_pos + 1}"
    lines.append(where)
    if rec.drafter:
        lines.append("auto drafted this step with " + _escape(rec.drafter))
    if rec.branch:
        lines.append(_escape(rec.branch) + " (1 = the drafter's first choice at each level)")
    if rec.inferred:
        lines.append(_escape(INFERRED))
    if rec.p is not None:
        lines.append(f"p (model) = {rec.p:.3f}")
    if rec.q is not None:
        lines.append(f"q (drafter) = {rec.q:.3f}")
    if rec.p is not None and rec.q is not None and rec.q > 0:
        lines.append(f"acceptance chance min(1, p/q) = {min(1.0, rec.p / rec.q):.3f}")
    return "<br>".join(lines)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def totals_of(summary_line: str) -> dict[str, str]:
    """The figures of a line `summary` wrote, as shown, by the dock's names: "tps" ("126.2"), "speedup" ("1.42×
    ±0.05"), "acceptance" ("62%"), "per_step" ("1.24"); those it has."""
    figures = {}
    for part in summary_line.split(" · "):
        if part.endswith(" tok/s"):
            figures["tps"] = part[: -len(" tok/s")]
        elif part.endswith(" vs plain"):
            figures["speedup"] = part[: -len(" vs plain")]
        elif part.startswith("speedup n/a"):
            figures["speedup"] = "n/a"
        elif part.startswith("acceptance "):
            figures["acceptance"] = part[len("acceptance "):]
        elif part.endswith(" tokens/step"):
            figures["per_step"] = part[: -len(" tokens/step")]
    return figures


EAGER_NOTE = "before this CPU's decoding step was ready (slower)"


def model_label(target: str) -> str:
    """A loaded model's name as a footer gives it: "SmolLM2-135M-Instruct (Q4_1 GGUF, bundled)" ->
    "SmolLM2-135M-Instruct", "qwen-coder-1.5b.gguf" -> "qwen-coder-1.5b"."""
    return target.split(" (")[0].removesuffix(".gguf")


def summary(strategy: str, finished, step: str = "", model: str = "") -> str:
    """One line under a finished answer: the model that wrote it (a chat may span a change of model), strategy,
    tokens, tokens/s, acceptance, speedup; and whether it ran while the decoding step was being prepared (`step`
    "compiling": eager, so its speed is not the usual)."""
    t = finished.totals
    parts = [*([model] if model else []), strategy, *tokens_parts(t)]  # no rate for an answer stopped before its second token
    if t.acceptance_rate is not None:
        parts.append(f"acceptance {t.acceptance_rate:.0%}")
        if (per_step := tokens_per_step(t)) is not None:
            parts.append(f"{per_step:.2f} tokens/step")
    if finished.speedup is not None:
        parts.append(speedup_part(finished.speedup, finished.speedup_err))
    if step == "compiling":
        parts.append(EAGER_NOTE)
    if finished.reason == "cancelled":
        parts.append("stopped")
    elif finished.reason == "length":
        parts.append("hit the token limit")
    return " · ".join(parts)
