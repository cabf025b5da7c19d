"""Bench results -> per-category and overall figures, a Markdown table, JSON and a per-prompt trace."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from ...api.metrics import SpeedupSum, summed
from .charts import write_charts
from .run import PEERS, Run


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _per_token(runs: list[Run], in_round: int | None = None) -> float:
    """Seconds a token over runs: their wall time (with `in_round`, that round's: Run.tries) over their tokens (greedy
    runs of one prompt have the same tokens, so a ratio of two is a ratio of wall times; sampled ones differ)."""
    seconds = sum(r.wall_s if in_round is None else r.tries[in_round] for r in runs)
    return seconds / max(1, sum(r.new_tokens for r in runs))


def _figures(pairs: list, base: list | None, hf: list | None, sampled: bool = False) -> dict:
    runs: list[Run] = [r for _, r in pairs]
    wall = sum(r.wall_s for r in runs)
    tokens = sum(r.new_tokens for r in runs)
    counts = summed(r.counts for r in runs)
    forwards, drafted, accepted = counts.target_forwards, counts.drafted, counts.accepted
    # sampled answers differ by design (the strategies keep the distribution, not the draws): nothing to compare
    same = sum(r.token_ids == b.token_ids for r, (_, b) in zip(runs, base)) if base and not sampled else None
    live = SpeedupSum.of(r.live for r in runs)
    return {
        "n": len(runs),
        "speedup": _ratio(_per_token([b for _, b in base]), _per_token(runs)) if base else None,
        "spread": _spread(runs, [b for _, b in base]) if base else None,
        # after the first token, as the live speedup counts: measured here (decode rates against none's
        # runs) and as the engine measured it inside each answer (docs/ENGINE.md)
        "decode_speedup": _decode_ratio(runs, [b for _, b in base]) if base else None,
        "live_speedup": live.value,
        "live_error": live.error,
        "speedup_vs_hf": _ratio(_per_token([h for _, h in hf]), _per_token(runs)) if hf else None,
        "tokens_per_s": _ratio(tokens, wall),
        "mean_accepted_length": _ratio(tokens, forwards) if forwards else None,
        "acceptance_rate": _ratio(accepted, drafted) if drafted else None,
        "per_position_acceptance": [a / d for a, d in zip(counts.position_accepted, counts.position_drafted) if d],
        "identical": f"{same}/{len(runs)}" if same is not None else None,
        "new_tokens": tokens,
        "wall_s": wall,
    }


def _spread(runs: list[Run], base: list[Run]) -> list[float] | None:
    """With --repeat: the speedup in each round of the bench (`none`'s time a token in the round over the runs'), as
    its lowest and highest; None with one round."""
    rounds = min((len(r.tries) for r in runs + base), default=0)
    if rounds < 2:
        return None
    ratios = [_ratio(_per_token(base, j), _per_token(runs, j)) for j in range(rounds)]
    ratios = [x for x in ratios if x is not None]
    return [min(ratios), max(ratios)] if len(ratios) >= 2 else None


def _decode_ratio(runs: list[Run], base: list[Run]) -> float | None:
    """How much faster than `base` the runs decoded after each turn's first token."""
    rate = _ratio(sum(r.decoded for r in runs), sum(r.decode_s for r in runs))
    base_rate = _ratio(sum(b.decoded for b in base), sum(b.decode_s for b in base))
    return _ratio(rate, base_rate) if rate and base_rate else None


def length_histogram(runs: list[Run]) -> list[int]:
    """counts[i] = verify steps that kept i draft tokens (steps whose drafter proposed nothing are not
    verify steps and are not counted; the target's own next token is not a draft token)."""
    counts: list[int] = []
    for r in runs:
        for kept in r.counts.accepted_lengths:
            counts.extend([0] * (kept + 1 - len(counts)))
            counts[kept] += 1
    return counts


def _pick(items: list | None, indices: list[int]) -> list | None:
    return [items[i] for i in indices] if items else None


# Spec-Bench reports six categories: MT-bench's eight count as one, "multi-turn conversation"
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SPEC_BENCH = ("multi-turn conversation", "translation", "summarization", "qa", "math_reasoning", "rag")


def spec_bench_group(category: str | None) -> str | None:
    if category in MT_BENCH:
        return SPEC_BENCH[0]
    return category if category in SPEC_BENCH else None


def spec_bench_view(results: dict[str, list]) -> dict:
    """Speedup over none in Spec-Bench's six categories (those present), and their mean, per strategy;
    empty when the prompts have none of them."""
    base_all = results.get("none")
    if not base_all:
        return {}
    view = {}
    for name, pairs in results.items():
        groups: dict[str, list[int]] = defaultdict(list)
        for i, (item, _) in enumerate(pairs):
            group = spec_bench_group(item.category)
            if group:
                groups[group].append(i)
        if not groups:
            return {}
        figures = {g: _figures(_pick(pairs, groups[g]), _pick(base_all, groups[g]), None)
                   for g in SPEC_BENCH if g in groups}
        cats = {g: f["speedup"] for g, f in figures.items()}
        view[name] = {"categories": cats, "speedup": statistics.mean(cats.values()),
                      "spreads": {g: f["spread"] for g, f in figures.items() if f["spread"]}}
        if name == "none":
            again = _rerun_view(pairs, groups)
            if again:
                view[NONE_AGAIN] = again
    return view


NONE_AGAIN = "none, run again"  # the Spec-Bench view's row of `none`'s last run of each prompt over its first


def _rerun_view(pairs: list, groups: dict[str, list[int]]) -> dict | None:
    """`none`'s own last run of each prompt over its first, as a speedup per category: what the machine's drift
    alone makes of the same answers (a strategy within it of 1.00x is within the bench's noise)."""
    cats = {}
    for g in SPEC_BENCH:
        halves = [pairs[i][1].first_last for i in groups.get(g, ()) if pairs[i][1].first_last]
        if halves:
            first, last = _per_token([h[0] for h in halves]), _per_token([h[1] for h in halves])
            cats[g] = first / last if last else None
    if not cats or None in cats.values():
        return None
    return {"categories": cats, "speedup": statistics.mean(cats.values())}


def summarize(results: dict[str, list], model: str, device: str, dtype: str, max_new_tokens: int,
              servers: set[str] = frozenset(), temperature: float = 0.0) -> dict:
    """Per category and overall figures of every strategy and peer. Sampled (`temperature` above 0) every answer
    differs: the speedups are per token and no identity is checked."""
    sampled = temperature > 0
    base_all = results.get("none")
    hf_all = results.get("hf")
    rows = []
    overall = {}
    for name, pairs in results.items():
        by_cat: dict[str, list[int]] = defaultdict(list)
        for i, (item, _) in enumerate(pairs):
            by_cat[item.category or "all"].append(i)
        cat_rows = []
        for cat, idx in by_cat.items():
            figures = _figures(_pick(pairs, idx), _pick(base_all, idx), _pick(hf_all, idx), sampled)
            cat_rows.append({"strategy": name, "category": cat, **figures})
        rows += cat_rows
        whole = _figures(pairs, base_all, hf_all, sampled)
        speedups = [r["speedup"] for r in cat_rows if r["speedup"] is not None]
        vs_hf = [r["speedup_vs_hf"] for r in cat_rows if r["speedup_vs_hf"] is not None]
        overall[name] = {
            "speedup": statistics.mean(speedups) if speedups else None,
            "speedup_vs_hf": statistics.mean(vs_hf) if vs_hf else None,
            "tokens_per_s": whole["tokens_per_s"],
            "decode_speedup": whole["decode_speedup"],
            "live_speedup": whole["live_speedup"],
            "live_error": whole["live_error"],
            "mean_accepted_length": whole["mean_accepted_length"],
            "acceptance_rate": whole["acceptance_rate"],
            "per_position_acceptance": whole["per_position_acceptance"],
            "accepted_length_histogram": length_histogram([r for _, r in pairs]),
            "identical": whole["identical"],
            "kind": "server" if name in servers else "peer" if name in PEERS else "strategy",
        }
    summary = {"model": model, "device": device, "dtype": dtype, "max_new_tokens": max_new_tokens,
               "temperature": temperature, "rows": rows, "overall": overall, "spec_bench": spec_bench_view(results)}
    halves = [r.first_last for _, r in base_all or () if r.first_last]
    if halves:
        first, last = ([h[i] for h in halves] for i in (0, 1))
        rates = [_ratio(sum(r.decoded for r in runs), sum(r.decode_s for r in runs)) for runs in (first, last)]
        summary["none_first_last"] = {"first_tokens_per_s": rates[0], "last_tokens_per_s": rates[1],
                                      "change": rates[1] / rates[0] - 1 if rates[0] and rates[1] else None}
    return summary


FIRST_LAST_TOLERANCE = 0.05  # `none` first and last in a prompt's turn: further apart, the run biases itself


def _checks(summary: dict) -> str:
    """The bench's checks of itself, in words: `none` measured first and last, and peers on this machine."""
    lines = []
    fl = summary.get("none_first_last")
    if fl and fl["change"] is not None:
        text = (f"`none` measured first and last in each prompt's turn: {fl['first_tokens_per_s']:.1f} and "
                f"{fl['last_tokens_per_s']:.1f} tokens/s after the first token ({fl['change']:+.1%})")
        if abs(fl["change"]) <= FIRST_LAST_TOLERANCE:
            lines.append(text + ": within 5%, no run in the turn slows the one after it.")
        else:
            lines.append(f"**{text}: more than 5% apart.** Something in the run slows what follows it (a peer on the "
                         "same cores, another program); its ratios carry that.")
    for name in summary.get("same_machine", ()):
        lines.append(f"Server peer {name} runs on this machine: it shares the cores with the strategies (and takes "
                     "some CPU while idle). Compare it like for like (`specula serve` as a peer beside it), and "
                     "strategies against each other with no peer running.")
    return "".join(line + "\n\n" for line in lines)


def _fmt(value, pattern="{:.2f}") -> str:
    return "-" if value is None else pattern.format(value)


def _live(figures: dict) -> str:
    """The live speedup with its error where known: 1.29x ±0.04."""
    text = _fmt(figures.get("live_speedup"), "{:.2f}x")
    error = figures.get("live_error")
    return text if error is None or figures.get("live_speedup") is None else f"{text} ±{error:.2f}"


def _speedup(row: dict) -> str:
    """A category's speedup, and with --repeat its lowest and highest round: 0.95x (0.90-1.02x)."""
    text = _fmt(row["speedup"], "{:.2f}x")
    spread = row.get("spread")
    return text if not spread or row["speedup"] is None else f"{text} ({spread[0]:.2f}-{spread[1]:.2f}x)"


def losses(summary: dict) -> str:
    """With --repeat, the categories below plain decoding in every round (a loss), and those below it only as a
    median, within the rounds' spread (no verdict), in words."""
    rows = [r for r in summary["rows"] if r["strategy"] != "none" and r.get("spread") and r["speedup"] is not None]
    if not rows:
        return ""
    lost = [r for r in rows if r["spread"][1] < 1.0]
    unsure = [r for r in rows if r["speedup"] < 1.0 <= r["spread"][1]]
    name = lambda r: f"{r['strategy']} in {r['category']} ({_speedup(r)})"  # noqa: E731
    text = ("Below plain decoding in every round: " + ", ".join(map(name, lost)) if lost else
            "No category below plain decoding in every round")
    if unsure:
        text += "; below it as a median but within the rounds' spread: " + ", ".join(map(name, unsure))
    return text + ".\n\n"


def to_markdown(summary: dict) -> str:
    weights = summary.get("weights")
    head = (f"Model: {summary['model']} | device {summary['device']} | dtype {summary['dtype']} | "
            + (f"weights {weights} | " if weights and weights != summary["dtype"] else "")
            + (f"step {summary['step']} | " if summary.get("step") else "")
            + f"max new tokens {summary['max_new_tokens']}")
    if summary.get("k"):
        head += " | longest draft k: " + ", ".join(f"{n} {k}" for n, k in summary["k"].items() if n != "none")
    if summary.get("temperature"):
        head += (f"\n\nSampled at temperature {summary['temperature']:g}: every run draws its own answer, so speedups "
                 "are tokens/s over `none`'s and no answer is compared with another")
    for name, where in summary.get("servers", {}).items():
        head += (f"\n\nServer peer {name}: {where}. Its acceptance comes from the server's spec-decode counters; "
                 "its identity is against this process's `none`, which runs another build of the model")
    head += "\n\n" + _checks(summary) + losses(summary)
    lines = ["| strategy | category | n | speedup vs none | vs hf | tokens/s | accepted length | acceptance | identical |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        lines.append(
            f"| {r['strategy']} | {r['category']} | {r['n']} | {_speedup(r)} | "
            f"{_fmt(r['speedup_vs_hf'], '{:.2f}x')} | {_fmt(r['tokens_per_s'], '{:.1f}')} | "
            f"{_fmt(r['mean_accepted_length'])} | {_fmt(r['acceptance_rate'], '{:.0%}')} | {r['identical'] or '-'} |"
        )
    lines += ["", "| strategy | overall speedup vs none | vs hf | tokens/s | accepted length | identical | "
                  "after the first token: measured | live (in the answers) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, o in summary["overall"].items():
        lines.append(
            f"| {name} | {_fmt(o['speedup'], '{:.2f}x')} | {_fmt(o['speedup_vs_hf'], '{:.2f}x')} | "
            f"{_fmt(o['tokens_per_s'], '{:.1f}')} | {_fmt(o['mean_accepted_length'])} | {o['identical'] or '-'} | "
            f"{_fmt(o.get('decode_speedup'), '{:.2f}x')} | {_live(o)} |"
        )
    view = summary.get("spec_bench")
    if view:
        cats = [c for c in SPEC_BENCH if c in next(iter(view.values()))["categories"]]
        lines += ["", "Spec-Bench's categories (MT-bench's eight as one multi-turn conversation), speedup vs none "
                      f"(\"{NONE_AGAIN}\": its last run of each prompt over its first, the bench's own noise):", "",
                  "| strategy | " + " | ".join(cats) + " | mean |", "|---" * (len(cats) + 2) + "|"]
        for name, v in view.items():
            spreads = v.get("spreads", {})
            lines.append(f"| {name} | " + " | ".join(_speedup({"speedup": v["categories"].get(c),
                                                               "spread": spreads.get(c)}) for c in cats)
                         + f" | {_fmt(v['speedup'], '{:.2f}x')} |")
    return head + "\n".join(lines) + "\n"


def public_json(summary: dict) -> dict:
    """The stable --json contract."""
    keys = ("strategy", "category", "n", "speedup", "speedup_vs_hf", "tokens_per_s", "mean_accepted_length",
            "acceptance_rate", "identical")
    overall_keys = ("speedup", "speedup_vs_hf", "tokens_per_s", "mean_accepted_length", "identical", "decode_speedup",
                    "live_speedup")
    return {
        **{k: summary[k] for k in ("model", "device", "dtype", "max_new_tokens")},
        "weights": summary.get("weights", summary["dtype"]),
        "step": summary.get("step", "eager"),
        "rows": [{k: r[k] for k in keys} for r in summary["rows"]],
        "overall": {n: {k: o[k] for k in overall_keys} for n, o in summary["overall"].items()},
    }


def first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """Index of the first token where two outputs differ (None when identical)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def write_out(folder: Path, summary: dict, results: dict[str, list]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    sampled = bool(summary.get("temperature"))
    (folder / "bench.md").write_text(to_markdown(summary), encoding="utf-8")
    (folder / "bench.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    with (folder / "trace.jsonl").open("w", encoding="utf-8") as f:
        for name, pairs in results.items():
            base = dict((id(item), run) for item, run in results.get("none", []))
            for item, run in pairs:
                b = base.get(id(item))
                f.write(json.dumps({
                    "strategy": name, "question_id": item.question_id, "category": item.category,
                    "new_tokens": run.new_tokens, "wall_s": run.wall_s, "target_forwards": run.counts.target_forwards,
                    "drafted": run.counts.drafted, "accepted": run.counts.accepted,
                    "accepted_lengths": list(run.counts.accepted_lengths),
                    "identical_to_none": (run.token_ids == b.token_ids) if b and not sampled else None,
                    "first_difference": first_difference(run.token_ids, b.token_ids) if b and not sampled else None,
                    # after the first token: the time it took, the speedup it measured against none's run of
                    # the same prompt, and the speedup the engine measured inside the answer (± one error)
                    "decoded": run.decoded, "decode_s": run.decode_s,
                    "decode_speedup": _decode_ratio([run], [b]) if b else None,
                    "live_speedup": run.live.value, "live_error": run.live.error,
                    **({"first_decode_s": run.first_last[0].decode_s, "last_decode_s": run.first_last[1].decode_s}
                       if run.first_last else {}),
                }) + "\n")
    with (folder / "steps.jsonl").open("w", encoding="utf-8") as f:  # every decoding step of every run
        for name, pairs in results.items():
            for item, run in pairs:
                for step in run.steps:
                    f.write(json.dumps({"strategy": name, "question_id": item.question_id, "category": item.category,
                                        **step}) + "\n")
    _write_charts(folder, summary)


def _write_charts(folder: Path, summary: dict) -> None:
    try:
        write_charts(folder, summary)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("matplotlib"):
            raise
        print("charts skipped: matplotlib is not installed (pip install 'matplotlib>=3.8')", file=sys.stderr)
