import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specula.engine.api.events import Totals
from specula.engine.cli.bench.charts import CHART_FILES, acceptance_chart, histogram_chart, speedup_chart, write_charts
from specula.engine.cli.bench.report import public_json, summarize, write_out
from specula.engine.cli.bench.run import Run
from specula.engine.cli.generate import PromptItem
from specula.engine.cli.main import main
from tests.support.tiny import one_torch_thread

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def bench(tiny_folder, tmp_path_factory):
    """One small bench with --out and --json: (stdout JSON report, output folder)."""
    tmp = tmp_path_factory.mktemp("bench")
    prompts = tmp / "q.jsonl"
    rows = [
        {"question_id": 1, "category": "a", "turns": ["Repeat: one two three one two three"]},
        {"question_id": 2, "category": "a", "turns": ["Hello", "And again"]},
        {"question_id": 3, "category": "b", "turns": ["Count: 1 2 3 4"]},
        {"question_id": 4, "category": "c", "turns": ["Not picked"]},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out_dir = tmp / "out"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), one_torch_thread():
        code = main([
            "bench", "--model", str(tiny_folder), "--dtype", "fp32", "--prompts", str(prompts), "--categories", "a,b",
            "--strategies", "none,prompt-lookup,layer-skip+no-confident", "--peers", "hf,hf-prompt-lookup", "--max-new-tokens", "16",
            "--out", str(out_dir), "--json",
        ])
    assert code == 0
    return json.loads(stdout.getvalue()), out_dir


def test_bench_json_contract(bench):
    report, out_dir = bench
    assert set(report) == {"model", "device", "dtype", "weights", "step", "max_new_tokens", "rows", "overall"}
    assert report["weights"] == "fp32"  # a dense folder: the products run on its fp32 weights
    assert report["step"] == "eager"  # SPECULA_STEP=eager for the tests
    assert {(r["strategy"], r["category"]) for r in report["rows"]} == {
        (s, c) for s in ("none", "prompt-lookup", "layer-skip+no-confident", "hf", "hf-prompt-lookup") for c in ("a", "b")
    }
    for row in report["rows"]:
        assert set(row) == {"strategy", "category", "n", "speedup", "speedup_vs_hf", "tokens_per_s",
                            "mean_accepted_length", "acceptance_rate", "identical"}
        assert row["n"] == (2 if row["category"] == "a" else 1)
    for figures in report["overall"].values():
        assert set(figures) == {"speedup", "speedup_vs_hf", "tokens_per_s", "mean_accepted_length", "identical",
                                "decode_speedup", "live_speedup"}
    none = report["overall"]["none"]
    assert none["speedup"] == 1.0 and none["identical"] == "3/3" and none["mean_accepted_length"] == 1.0
    # after the first token: measured against none's own runs, and as the answers measured themselves
    # (none's steps are plain: its live figure is 1 less the time of asking for a draft, about 1% of a tiny step)
    assert none["decode_speedup"] == 1.0 and none["live_speedup"] == pytest.approx(1.0, abs=0.03)
    assert report["overall"]["prompt-lookup"]["live_speedup"] > 0 and report["overall"]["hf"]["live_speedup"] is None
    # fp32: speculation never changes the answer
    assert report["overall"]["prompt-lookup"]["identical"] == "3/3"
    assert report["overall"]["layer-skip+no-confident"]["identical"] == "3/3"
    assert report["overall"]["hf"]["speedup_vs_hf"] == 1.0
    assert (out_dir / "bench.md").is_file() and (out_dir / "bench.json").is_file()
    trace = [json.loads(line) for line in (out_dir / "trace.jsonl").read_text().splitlines()]
    assert len(trace) == 5 * 3


def test_bench_writes_three_png_charts(bench):
    _, out_dir = bench
    for name in CHART_FILES:
        data = (out_dir / name).read_bytes()
        assert data[:8] == PNG_MAGIC, name
        assert len(data) > 10_000, name  # a drawn chart, not an empty image


def test_accepted_length_histogram_counts_every_verify_step(bench):
    _, out_dir = bench
    summary = json.loads((out_dir / "bench.json").read_text())
    trace = [json.loads(line) for line in (out_dir / "trace.jsonl").read_text().splitlines()]
    for name, figures in summary["overall"].items():
        histogram = figures["accepted_length_histogram"]
        mine = [t for t in trace if t["strategy"] == name]
        assert sum(histogram) == sum(len(t["accepted_lengths"]) for t in mine), name
        assert sum(i * n for i, n in enumerate(histogram)) == sum(t["accepted"] for t in mine), name
    assert summary["overall"]["none"]["accepted_length_histogram"] == []
    assert summary["overall"]["hf"]["accepted_length_histogram"] == []
    assert sum(summary["overall"]["prompt-lookup"]["accepted_length_histogram"]) > 0


def test_speedup_chart_draws_the_json_values(bench, tmp_path):
    report, out_dir = bench
    summary = json.loads((out_dir / "bench.json").read_text())
    drawn = speedup_chart(summary, tmp_path / "speedup.png")
    expected: dict[str, dict[str, float]] = {}
    for row in report["rows"]:
        if row["strategy"] != "none" and row["speedup"] is not None:
            expected.setdefault(row["strategy"], {})[row["category"]] = row["speedup"]
    for name, figures in report["overall"].items():
        if name != "none" and figures["speedup"] is not None:
            expected[name]["overall"] = figures["speedup"]
    assert drawn == expected  # the very numbers, not rounded ones
    assert set(drawn) == {"prompt-lookup", "layer-skip+no-confident", "hf", "hf-prompt-lookup"}


def test_other_charts_draw_the_json_values(bench, tmp_path):
    _, out_dir = bench
    summary = json.loads((out_dir / "bench.json").read_text())
    lines = acceptance_chart(summary, tmp_path / "a.png")
    bars = histogram_chart(summary, tmp_path / "h.png")
    overall = summary["overall"]
    # plain decoding and the transformers peers draft nothing: left out, no error
    assert set(lines) == {"prompt-lookup", "layer-skip+no-confident"}
    for name, ys in lines.items():
        assert ys == pytest.approx(overall[name]["per_position_acceptance"])
    for name, counts in bars.items():
        assert counts == overall[name]["accepted_length_histogram"]


def _summary(with_none: bool = True) -> dict:
    """A summary built from hand-made runs: a strategy, a peer, and optionally the baseline."""
    items = [PromptItem(("x",), 1, "a"), PromptItem(("y",), 2, "b")]

    def runs(wall, lengths=()):
        counts = Totals(new_tokens=3, steps=2, target_forwards=3, drafted=2 * len(lengths), accepted=sum(lengths),
                        wall_s=wall, prefill_s=0.0, draft_s=0.0, verify_s=0.0, accepted_lengths=tuple(lengths),
                        position_drafted=(len(lengths),) * 2,
                        position_accepted=(sum(v > 0 for v in lengths), sum(v > 1 for v in lengths)))
        return [(item, Run((1, 2, 3), 3, wall, counts=counts)) for item in items]

    results = {"none": runs(2.0)} if with_none else {}
    results["prompt-lookup"] = runs(1.0, [2, 0, 1, 2])
    results["hf"] = runs(2.5)
    return summarize(results, "tiny", "cpu", "fp32", 16)


def test_histogram_entry_does_not_change_the_public_json():
    summary = _summary()
    assert summary["overall"]["prompt-lookup"]["accepted_length_histogram"] == [2, 2, 4]
    assert "accepted_length_histogram" not in public_json(summary)["overall"]["prompt-lookup"]


def test_charts_without_a_baseline_skip_missing_speedups(tmp_path):
    summary = _summary(with_none=False)
    assert summary["overall"]["prompt-lookup"]["speedup"] is None
    paths = write_charts(tmp_path, summary)
    assert [p.name for p in paths] == list(CHART_FILES)
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)
    assert speedup_chart(summary, tmp_path / "s.png") == {}


def test_bench_output_without_matplotlib_skips_the_charts(tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    write_out(tmp_path, _summary(), {})
    assert (tmp_path / "bench.json").is_file() and (tmp_path / "bench.md").is_file()
    assert not any((tmp_path / name).exists() for name in CHART_FILES)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0] and "pip install" in err[0]


def test_drawing_charts_loads_no_qt(tmp_path):
    code = (
        "import sys\n"
        "from tests.engine.test_bench import _summary\n"
        "from specula.engine.cli.bench.charts import write_charts\n"
        f"write_charts({str(tmp_path)!r}, _summary())\n"
        "bad = [m for m in sys.modules if m.startswith(('PySide6', 'PyQt', 'pyqtgraph', 'shiboken6'))]\n"
        "bad += [m for m in sys.modules if m == 'matplotlib.pyplot']  # pyplot is what picks a GUI backend\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {**os.environ, "MPLBACKEND": "QtAgg"}  # even when the user prefers a Qt backend
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_spec_bench_view_merges_mt_bench_into_one_category():
    from specula.engine.cli.bench.report import spec_bench_view, to_markdown

    items = [PromptItem(("a",), 1, "writing"), PromptItem(("b",), 2, "coding"), PromptItem(("c",), 3, "qa"),
             PromptItem(("d",), 4, "code_editing")]
    base = [2.0, 6.0, 3.0, 5.0]
    fast = [1.0, 3.0, 3.0, 1.0]  # MT-bench: (2 + 6) / (1 + 3) = 2.0x; qa 1.0x; code_editing is not Spec-Bench's
    results = {"none": [(i, Run((1,), 1, w)) for i, w in zip(items, base)],
               "prompt-lookup": [(i, Run((1,), 1, w)) for i, w in zip(items, fast)]}
    view = spec_bench_view(results)
    assert view["prompt-lookup"]["categories"] == {"multi-turn conversation": 2.0, "qa": 1.0}
    assert view["prompt-lookup"]["speedup"] == 1.5
    assert view["none"]["speedup"] == 1.0
    summary = summarize(results, "tiny", "cpu", "fp32", 16)
    assert "| prompt-lookup | 2.00x | 1.00x | 1.50x |" in to_markdown(summary)
    assert "spec_bench" not in public_json(summary)
    assert spec_bench_view({"none": [(PromptItem(("x",), 1, "mine"), Run((1,), 1, 1.0))]}) == {}


def test_steps_trace_has_every_decoding_step(bench):
    _, out_dir = bench
    trace = [json.loads(line) for line in (out_dir / "trace.jsonl").read_text().splitlines()]
    steps = [json.loads(line) for line in (out_dir / "steps.jsonl").read_text().splitlines()]
    for run in trace:
        mine = [s for s in steps if s["strategy"] == run["strategy"] and s["question_id"] == run["question_id"]]
        if run["strategy"].startswith("hf"):
            assert mine == []  # transformers' generate() exposes no steps
            continue
        assert sum(s["new_tokens"] for s in mine) == run["new_tokens"]
        assert sum(s["accepted"] for s in mine) == run["accepted"]
        assert len([s for s in mine if s["step"] > 0]) + len({s["turn"] for s in mine}) == run["target_forwards"]
        assert all(s["step"] == 0 for s in mine if s["step"] == 0 and s["drafted"] == 0)
        assert {s["turn"] for s in mine} == set(range(len({s["turn"] for s in mine})))


def test_the_bench_checks_itself_with_none_measured_first_and_last(bench):
    """`none` runs first and last in each prompt's turn; the report gives both rates and says whether they
    agree within 5% (here nothing else runs: a tiny model, so only that the figures are there)."""
    _, out_dir = bench
    fl = json.loads((out_dir / "bench.json").read_text())["none_first_last"]
    assert fl["first_tokens_per_s"] > 0 and fl["last_tokens_per_s"] > 0
    assert fl["change"] == pytest.approx(fl["last_tokens_per_s"] / fl["first_tokens_per_s"] - 1)
    assert "`none` measured first and last in each prompt's turn" in (out_dir / "bench.md").read_text()


def test_a_run_that_slows_the_one_after_it_is_named_and_a_peer_on_this_machine_too():
    from specula.engine.cli.bench.command import on_this_machine
    from specula.engine.cli.bench.report import to_markdown

    item = PromptItem(("x",), 1, "a")

    def none(decode_s):
        return Run((1, 2, 3), 3, decode_s + 0.1, decoded=2, decode_s=decode_s)

    def summary(first_s, last_s):
        results = {"none": [(item, Run.mean_of(none(first_s), none(last_s)))], "prompt-lookup": [(item, none(0.5))]}
        return summarize(results, "tiny", "cpu", "fp32", 16)

    quiet, biased = summary(1.0, 1.02), summary(1.0, 1.5)
    assert quiet["overall"]["prompt-lookup"]["decode_speedup"] == pytest.approx(1.01 / 0.5)  # against their mean
    assert biased["none_first_last"]["change"] == pytest.approx(1.0 / 1.5 - 1)
    assert "within 5%" in to_markdown(quiet) and "more than 5% apart" not in to_markdown(quiet)
    assert "more than 5% apart" in to_markdown(biased)
    biased["same_machine"] = ["llama"]
    assert "Server peer llama runs on this machine" in to_markdown(biased)
    assert on_this_machine("http://127.0.0.1:8080") and on_this_machine("http://localhost:8080/v1")
    assert not on_this_machine("http://192.0.2.7:8080")  # a documentation address: another machine


def test_a_variant_sets_an_option_to_a_number_or_a_word():
    from specula.engine.cli.bench.run import split_variant, variant_options

    strategy, flags = split_variant("auto+skip=draft-model+draft_vocab=0+no-confident")
    assert strategy == "auto"
    assert variant_options(flags) == (("skip", "draft-model"), ("draft_vocab", 0), ("confident", 0))


def test_the_spec_bench_view_shows_nones_own_rerun_as_the_benchs_noise():
    from specula.engine.cli.bench.report import NONE_AGAIN, spec_bench_view, to_markdown
    from specula.engine.cli.bench.run import Run
    from specula.engine.cli.common import PromptItem

    def none_run(first: float, last: float) -> Run:
        return Run.mean_of(Run((1, 2), 2, first), Run((1, 2), 2, last))

    qa, tr = PromptItem(("q",), 1, "qa"), PromptItem(("t",), 2, "translation")
    results = {"none": [(qa, none_run(1.0, 1.25)), (tr, none_run(2.0, 2.0))],
               "prompt-lookup": [(qa, Run((1, 2), 2, 1.0)), (tr, Run((1, 2), 2, 2.5))]}
    view = spec_bench_view(results)
    assert view[NONE_AGAIN]["categories"] == {"translation": 1.0, "qa": 0.8}  # qa's second run of none: slower
    assert view["prompt-lookup"]["categories"] == {"translation": 0.8, "qa": pytest.approx(1.125)}
    summary = {"model": "m", "device": "cpu", "dtype": "fp32", "max_new_tokens": 2, "rows": [], "overall": {},
               "spec_bench": view}
    assert f"| {NONE_AGAIN} | 1.00x | 0.80x | 0.90x |" in to_markdown(summary)


def test_with_repeats_each_category_has_its_rounds_spread_and_a_loss_is_one_in_every_round():
    """--repeat keeps each round's time: a category's speedup comes with its lowest and highest round, and a
    category counts as a loss only where every round is below plain decoding (else: within the rounds' spread)."""
    from specula.engine.cli.bench.report import losses, summarize, to_markdown
    from specula.engine.cli.bench.run import median_run

    qa, tr, code = PromptItem(("q",), 1, "qa"), PromptItem(("t",), 2, "translation"), PromptItem(("c",), 3, "coding")

    def runs(*walls):
        return median_run([Run((1, 2), 2, w) for w in walls])

    results = {"none": [(qa, runs(1.0, 1.0, 1.0)), (tr, runs(1.0, 1.0, 1.0)), (code, runs(1.0, 1.0, 1.0))],
               "auto": [(qa, runs(1.05, 0.95, 1.02)), (tr, runs(1.2, 1.25, 1.1)), (code, runs(0.5, 0.6, 0.55))]}
    summary = summarize(results, "m", "cpu", "bf16", 8)
    rows = {r["category"]: r for r in summary["rows"] if r["strategy"] == "auto"}
    assert rows["translation"]["spread"] == pytest.approx([1 / 1.25, 1 / 1.1])
    assert rows["qa"]["speedup"] < 1.0 <= rows["qa"]["spread"][1]  # a median below 1.0x, one round above it
    text = losses(summary)
    assert "every round: auto in translation (0.83x (0.80-0.91x))" in text
    assert "within the rounds' spread: auto in qa (0.98x (0.95-1.05x))" in text and "auto in coding" not in text
    assert text in to_markdown(summary) and "1.82x (1.67-2.00x)" in to_markdown(summary)  # coding, both tables
    once = {n: [(item, median_run([Run((1, 2), 2, run.wall_s)])) for item, run in pairs] for n, pairs in results.items()}
    assert losses(summarize(once, "m", "cpu", "bf16", 8)) == ""  # one round: no spread, no verdict


def test_a_later_round_does_not_draft_the_answer_of_the_round_before():
    """--repeat: the second round of a prompt learns nothing and leaves the first round's answer out, so a strategy
    that drafts from earlier answers drafts as in the first round, not the answer it gave there."""
    from specula.engine.api.events import Finished
    from specula.engine.api.metrics import summed
    from specula.engine.api.types import DecodeConfig, LoadRequest
    from specula.engine.cli.bench.run import Bench
    from specula.engine.cli.common import Asked

    sent = []

    class Backend:
        def generate(self, request):
            sent.append(request.config)
            yield Finished(0, "length", "an answer", (5, 6, 7), summed(()))

    bench, item = Bench(None, Asked("suffix", DecodeConfig(), (), LoadRequest())), PromptItem(("x",), 1, "a")
    for _ in range(3):
        bench._run_turns(Backend(), "suffix", (), item, "suffix")
    assert sent[0].learn and sent[0].leave_out == ()
    assert all(not c.learn and c.leave_out == ((5, 6, 7),) for c in sent[1:])
    sent.clear()  # a server peer (`specula serve` keeps what it learns) is asked the same
    served = Bench(None, Asked("none", DecodeConfig(), (), LoadRequest()), remotes={"specula-auto": Backend()})
    for _ in range(2):
        served.run("specula-auto", item)
    assert sent[0].learn and not sent[1].learn and sent[1].leave_out == ((5, 6, 7),)


def test_sampled_runs_are_compared_by_their_time_a_token_and_not_by_their_answers():
    """At a temperature every run draws its own answer and length: a strategy's speedup is its tokens/s over
    `none`'s (a run of half the tokens in 40% of the time is 1.25x, not 2.5x), in every round, in `none`'s own
    first-and-last check and in a prompt's median; no answer is compared with another."""
    from specula.engine.cli.bench.report import spec_bench_view, to_markdown
    from specula.engine.cli.bench.run import median_run

    qa = PromptItem(("q",), 1, "qa")
    run = lambda tokens, wall: Run(tuple(range(tokens)), tokens, wall)  # noqa: E731
    none = Run.mean_of(run(100, 10.0), run(50, 6.0))  # 0.10 and 0.12 s a token: 0.11 for the first's 100 tokens
    assert none.wall_s == pytest.approx(11.0) and none.new_tokens == 100
    middle = median_run([run(100, 10.0), run(50, 4.0), run(80, 10.0)])  # 0.100, 0.080, 0.125 s a token
    assert (middle.new_tokens, middle.wall_s) == (100, pytest.approx(10.0))
    assert middle.tries == pytest.approx((10.0, 8.0, 12.5))  # each round's time for the median run's tokens
    results = {"none": [(qa, median_run([none, none]))], "auto": [(qa, median_run([run(50, 4.4), run(40, 4.4)]))]}
    summary = summarize(results, "m", "cpu", "bf16", 128, temperature=0.7)
    auto = next(r for r in summary["rows"] if r["strategy"] == "auto")
    assert auto["speedup"] == pytest.approx(0.11 / ((4.4 / 50 + 4.4 / 40) / 2))
    assert auto["spread"] == pytest.approx([0.11 / (4.4 / 40), 0.11 / (4.4 / 50)])
    assert auto["identical"] is None and summary["overall"]["auto"]["identical"] is None
    assert "Sampled at temperature 0.7" in to_markdown(summary)
    again = spec_bench_view({"none": [(qa, none)]})["none, run again"]["categories"]["qa"]
    assert again == pytest.approx(0.10 / 0.12)  # the first run's time a token over the last's
    greedy = summarize({"none": [(qa, run(100, 10.0))], "auto": [(qa, run(100, 8.0))]}, "m", "cpu", "bf16", 128)
    assert next(r for r in greedy["rows"] if r["strategy"] == "auto")["identical"] == "1/1"
    assert "Sampled" not in to_markdown(greedy)


def test_a_sampled_bench_runs_and_compares_no_answers(tiny_folder, tmp_path):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "a", "turns": ["Count: 1 2 3 1 2 3"]}) + "\n")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), one_torch_thread():
        code = main(["bench", "--model", str(tiny_folder), "--dtype", "fp32", "--prompts", str(prompts),
                     "--strategies", "none,prompt-lookup", "--peers", "hf", "--max-new-tokens", "12",
                     "--temperature", "0.7", "--repeat", "2", "--json"])
    assert code == 0
    report = json.loads(stdout.getvalue())
    for name in ("none", "prompt-lookup", "hf"):
        assert report["overall"][name]["identical"] is None and report["overall"][name]["speedup"] > 0
    from specula.engine.cli.common import read_flags
    from specula.engine.cli.main import build_parser

    args = build_parser().parse_args(["bench", "--prompts", str(prompts), "--temperature", "0.7"])
    assert read_flags(args, measure_baseline=False, prepare=False).config.seed is None  # drawn afresh, as a user's
