import json

from engine.cli import main


def test_bench_json_contract(capsys, tiny_folder, tmp_path):
    prompts = tmp_path / "q.jsonl"
    rows = [
        {"question_id": 1, "category": "a", "turns": ["Repeat: one two three one two three"]},
        {"question_id": 2, "category": "a", "turns": ["Hello", "And again"]},
        {"question_id": 3, "category": "b", "turns": ["Count: 1 2 3 4"]},
        {"question_id": 4, "category": "c", "turns": ["Not picked"]},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out_dir = tmp_path / "out"
    code = main([
        "bench", "--model", str(tiny_folder), "--dtype", "fp32", "--prompts", str(prompts), "--categories", "a,b",
        "--strategies", "none,prompt-lookup,layer-skip", "--peers", "hf,hf-prompt-lookup", "--max-new-tokens", "16",
        "--out", str(out_dir), "--json",
    ])
    out = capsys.readouterr().out
    assert code == 0
    report = json.loads(out)
    assert set(report) == {"model", "device", "dtype", "max_new_tokens", "rows", "overall"}
    assert {(r["strategy"], r["category"]) for r in report["rows"]} == {
        (s, c) for s in ("none", "prompt-lookup", "layer-skip", "hf", "hf-prompt-lookup") for c in ("a", "b")
    }
    for row in report["rows"]:
        assert set(row) == {"strategy", "category", "n", "speedup", "speedup_vs_hf", "tokens_per_s",
                            "mean_accepted_length", "acceptance_rate", "identical"}
        assert row["n"] == (2 if row["category"] == "a" else 1)
    none = report["overall"]["none"]
    assert none["speedup"] == 1.0 and none["identical"] == "3/3" and none["mean_accepted_length"] == 1.0
    # fp32: speculation never changes the answer
    assert report["overall"]["prompt-lookup"]["identical"] == "3/3"
    assert report["overall"]["layer-skip"]["identical"] == "3/3"
    assert report["overall"]["hf"]["speedup_vs_hf"] == 1.0
    assert (out_dir / "bench.md").is_file() and (out_dir / "bench.json").is_file()
    trace = [json.loads(line) for line in (out_dir / "trace.jsonl").read_text().splitlines()]
    assert len(trace) == 5 * 3
