"""The command line's contract: bad input exits non-zero with one clear line and no traceback."""

import json

import pytest

from engine.cli import main


def run_cli(capsys, *args):
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *words):
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith("specula: error:")
    for w in words:
        assert w in lines[0], lines[0]


def test_strategies_lists_the_registry(capsys):
    from engine.drafters import DRAFTERS

    code, out, _ = run_cli(capsys, "strategies")
    assert code == 0
    assert [line.split("\t")[0] for line in out.splitlines()] == list(DRAFTERS)
    assert {"eagle", "medusa", "lookahead", "auto"} <= set(DRAFTERS)


def test_strategies_for_a_model_says_which_it_can_use(capsys, tiny_folder):
    code, out, _ = run_cli(capsys, "strategies", "--model", str(tiny_folder), "--dtype", "fp32")
    assert code == 0
    rows = dict(line.split("\t") for line in out.splitlines()[1:])
    assert rows["lookahead"] == "available" and rows["auto"] == "available"
    assert rows["eagle"].startswith("needs an eagle head") and rows["medusa"].startswith("needs a medusa head") and rows["draft-model"] == "needs --draft-model"


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "/no/such/model.gguf"], ["not found"]),
        (["--model", "./no-such-folder"], ["not found"]),
        (["--strategy", "warp-drive"], ["unknown strategy", "prompt-lookup"]),
        (["--k", "0"], ["k must be"]),
        (["--k", "two"], ["--k"]),
        (["--temperature", "-1"], ["temperature"]),
        (["--top-p", "0"], ["top-p"]),
        (["--max-new-tokens", "0"], ["max new tokens"]),
        (["--strategy", "draft-model"], ["needs --draft-model"]),
    ],
)
def test_bad_input_is_one_clear_line(capsys, args, words):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", *args)
    assert_one_line_error(code, err, *words)


def test_missing_prompts_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "generate", "--prompts", str(tmp_path / "none.jsonl"))
    assert_one_line_error(code, err, "prompts file not found")


def test_malformed_prompts_file(capsys, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    code, _, err = run_cli(capsys, "generate", "--prompts", str(bad))
    assert_one_line_error(code, err, "line 2")


def test_a_prompts_file_with_a_byte_order_mark_reads_and_binary_junk_is_one_line(capsys, tmp_path):
    from engine.generate_cmd import read_prompts

    bom = tmp_path / "bom.jsonl"
    bom.write_bytes("\ufeff".encode() + b'{"prompt": "caf\xc3\xa9"}\n')
    assert [i.turns for i in read_prompts(bom)] == [("café",)]
    junk = tmp_path / "junk.jsonl"
    junk.write_bytes(bytes(range(256)) * 4)
    code, _, err = run_cli(capsys, "generate", "--prompts", str(junk))
    assert_one_line_error(code, err, "junk.jsonl is not UTF-8 text")


@pytest.mark.parametrize("damage, words", [
    ("config-type", ["config.json has a value of the wrong type for 'hidden_size'"]),
    ("truncated", ["weights file (*.safetensors) is damaged or cut short"]),
    ("shape", ["do not have the sizes its config.json describes"]),
])
def test_a_damaged_model_folder_is_one_line_that_says_what_is_wrong(capsys, tiny_folder, tmp_path, damage, words):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    if damage == "truncated":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        config["hidden_size"] = "thirty-two" if damage == "config-type" else 64
        (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "generate", "--model", str(folder), "--prompt", "hi", "--dtype", "fp32")
    assert_one_line_error(code, err, str(folder), *words)


def test_offline_hub_id_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(capsys, "generate", "--model", "nobody/no-such-model-xyz", "--prompt", "hi")
    assert_one_line_error(code, err, "nobody/no-such-model-xyz", "cannot be reached")


def test_draft_with_another_vocabulary(capsys, tiny_folder, other_vocab_folder):
    code, _, err = run_cli(
        capsys, "generate", "--model", str(tiny_folder), "--draft-model", str(other_vocab_folder),
        "--strategy", "draft-model", "--prompt", "hi", "--json",
    )
    assert_one_line_error(code, err, "tokenizer differs", "49152", "49154")


def test_prompt_longer_than_the_context(capsys, tiny_folder):
    code, _, err = run_cli(capsys, "generate", "--model", str(tiny_folder), "--prompt", "word " * 300, "--json")
    assert_one_line_error(code, err, "context window is 128")


def test_json_output_for_multi_turn_prompts(capsys, tiny_folder, tmp_path):
    prompts = tmp_path / "p.jsonl"
    rows = [
        {"question_id": 7, "category": "demo", "turns": ["Say hi.", "Now say bye."]},
        {"prompt": "Count to three."},
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    code, out, err = run_cli(
        capsys, "generate", "--model", str(tiny_folder), "--dtype", "fp32", "--chat", "--strategy",
        "prompt-lookup", "--prompts", str(prompts), "--max-new-tokens", "12", "--json",
    )
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 2
    first, second = records
    for key in ("text", "token_ids", "strategy", "new_tokens", "steps", "target_forwards", "drafted", "accepted",
                "acceptance_rate", "mean_accepted_length", "wall_s", "tokens_per_s", "finish_reason"):
        assert key in first and key in second
    assert first["question_id"] == 7 and "question_id" not in second
    assert len(first["turns"]) == 2 and "turns" not in second
    assert first["token_ids"] == first["turns"][-1]["token_ids"]
    assert first["new_tokens"] == sum(t["new_tokens"] for t in first["turns"])
    assert first["strategy"] == "prompt-lookup"
    # the live speedup of each answer (docs/ENGINE.md), over several turns weighted by their decode time
    assert all(isinstance(r["speedup"], float) and r["speedup"] > 0 for r in (first, second, *first["turns"]))
    assert min(t["speedup"] for t in first["turns"]) <= first["speedup"] <= max(t["speedup"] for t in first["turns"])
