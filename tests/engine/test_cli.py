"""The command line's contract: bad input exits non-zero with one clear line and no traceback."""

import json
import os

import pytest

from specula.engine.api.errors import SpeculaError
from specula.engine.api.types import SEED_MAX, SEED_MIN, DecodeConfig
from specula.engine.cli.main import main


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
    from specula.engine.drafters import DRAFTERS

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


@pytest.mark.parametrize("line", ['{"nope": 1}', "[" * 50000 + "]" * 50000])  # the second: a RecursionError once
def test_malformed_prompts_file(capsys, tmp_path, line):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n' + line + "\n")
    code, _, err = run_cli(capsys, "generate", "--prompts", str(bad))
    assert_one_line_error(code, err, "line 2")


def test_turns_that_are_a_string_are_refused_not_read_letter_by_letter(tmp_path):
    from specula.engine.api.errors import SpeculaError
    from specula.engine.cli.common import read_prompts

    bad = tmp_path / "turns.jsonl"
    bad.write_text('{"turns": "abc"}\n')
    with pytest.raises(SpeculaError, match='line 1: needs a "prompt" string or a "turns" list of strings'):
        read_prompts(bad)


def test_a_prompts_file_with_a_byte_order_mark_reads_and_binary_junk_is_one_line(capsys, tmp_path):
    from specula.engine.cli.common import read_prompts

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
    ("deep", ["config.json nests lists or objects too deeply"]),  # a RecursionError in Python's reader
])
def test_a_damaged_model_folder_is_one_line_that_says_what_is_wrong(capsys, tiny_folder, tmp_path, damage, words):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    if damage == "truncated":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "deep":
        (folder / "config.json").write_text(json.dumps(config)[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
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


# -- bad numbers and folders are refused before anything loads or runs ------------------------------------
@pytest.mark.parametrize("command", [["generate", "--prompt", "hi"], ["chat"], ["train-head"]])
@pytest.mark.parametrize("seed", [str(2**70), str(SEED_MAX + 1), str(SEED_MIN - 1)])
def test_a_seed_outside_64_bits_is_refused_when_parsed(capsys, command, seed):
    code, _, err = run_cli(capsys, *command, "--seed", seed, "--model", "/no/such/model.gguf")
    assert code == 2
    assert_one_line_error(code, err, "argument --seed", f"between {SEED_MIN} and {SEED_MAX}")


def test_the_seeds_one_range_is_what_a_generator_takes():
    """The range the command line, the server, the app's settings and its dialog hold a seed to: a generator takes
    its ends, and a request outside it is refused in one line (a seed past it failed every send of the app)."""
    import torch

    from specula.engine.decoding.loop import make_generator

    assert {make_generator(torch.device("cpu"), seed).initial_seed() for seed in (SEED_MIN, SEED_MAX)} == {
        1 << 63, SEED_MAX}
    for seed in (SEED_MIN - 1, SEED_MAX + 1):
        with pytest.raises(SpeculaError, match=f"the seed must be a whole number from {SEED_MIN} to {SEED_MAX}"):
            DecodeConfig(seed=seed)


@pytest.mark.parametrize("flag, value", [("--tokens", "0"), ("--epochs", "-1"), ("--lr", "nan"), ("--lr", "-1"),
                                         ("--lr", "inf"), ("--draft-vocab", "-1"), ("--batch", "0"),
                                         ("--train-batch", "0"), ("--max-new-tokens", "0"),
                                         ("--model-questions", "1.5"), ("--model-questions", "-0.1"),
                                         ("--model-questions", "half")])
def test_each_bad_training_option_names_its_flag(capsys, tmp_path, flag, value):
    code, _, err = run_cli(capsys, "train-head", "--model", "/no/such/model.gguf", "--out", str(tmp_path), flag, value)
    assert code == 2
    assert_one_line_error(code, err, f"argument {flag}:", value)


def test_training_options_name_the_one_that_is_wrong():
    from specula.engine.api.errors import SpeculaError
    from specula.engine.heads.train import TrainOptions, check_options

    for field, value, words in [("epochs", 0, "epochs must be at least 1"), ("lr", float("nan"), "learning rate"),
                                ("max_new_tokens", 0, "max new tokens"), ("draft_vocab", -1, "draft vocabulary"),
                                ("written", 1.2, "questions the model writes")]:
        with pytest.raises(SpeculaError, match=words):
            check_options(TrainOptions(**{field: value}))


@pytest.mark.parametrize("field, value", [("num_hidden_layers", -1), ("hidden_size", 0), ("vocab_size", -5),
                                          ("num_attention_heads", 0), ("intermediate_size", -1)])
def test_a_config_with_an_impossible_size_names_config_json_and_the_field(capsys, tiny_folder, tmp_path, field, value):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli(capsys, "generate", "--model", str(folder), "--prompt", "hi", "--dtype", "fp32")
    assert code == 2
    assert_one_line_error(code, err, "config.json", f"'{field}'", str(value))


@pytest.mark.parametrize("damage, words", [("empty", "tokenizer.json is empty"),
                                           ("cut", "tokenizer.json is damaged or cut short")])
def test_a_broken_tokenizer_file_is_named(capsys, tiny_folder, tmp_path, damage, words):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_folder, folder)
    tokenizer = folder / "tokenizer.json"
    tokenizer.write_text("" if damage == "empty" else tokenizer.read_text()[:5000])
    code, _, err = run_cli(capsys, "generate", "--model", str(folder), "--prompt", "hi", "--dtype", "fp32")
    assert code == 2
    assert_one_line_error(code, err, words)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="pipes by name")
@pytest.mark.parametrize("kind, words", [("folder", "is a folder, not a GGUF file"),
                                         ("fifo", "is a pipe or a device (as <(...) gives), not a file"),
                                         ("pipe", "is a pipe or a device (as <(...) gives), not a file")])
def test_a_model_that_is_a_folder_or_a_pipe_is_named_as_such_not_as_missing(capsys, tmp_path, kind, words):
    path = tmp_path / "x.gguf"
    read, write = os.pipe()  # what a shell's process substitution gives: /dev/fd/N
    try:
        if kind == "folder":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path = f"/dev/fd/{read}"
        code, _, err = run_cli(capsys, "generate", "--model", str(path), "--prompt", "hi")
    finally:
        os.close(read)
        os.close(write)
    assert_one_line_error(code, err, str(path), words)
    assert "not found" not in err


@pytest.mark.parametrize("content", [b"GGUF", b"GGUF\x03\x00\x00\x00", b"GGUF\x03\x00\x00\x00" + b"\x05" * 40])
def test_a_truncated_gguf_file_says_so_with_its_size(capsys, tmp_path, monkeypatch, content):
    monkeypatch.setenv("SPECULA_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "cut.gguf"
    model.write_bytes(content)
    code, _, err = run_cli(capsys, "generate", "--model", str(model), "--prompt", "hi")
    assert code == 2
    assert_one_line_error(code, err, "cut.gguf", f"the file is truncated ({len(content)} bytes)")
    assert "unpack" not in err


def _gguf(path, *pairs: tuple[str, int, bytes]):
    """A GGUF v3 file without tensors holding these (key, type, value bytes) pairs."""
    def text(s: str) -> bytes:
        return len(s).to_bytes(8, "little") + s.encode()

    body = b"".join(text(key) + kind.to_bytes(4, "little") + value for key, kind, value in pairs)
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + len(pairs).to_bytes(8, "little")
                     + body)
    return path


def test_a_gguf_of_deeply_nested_arrays_or_with_only_its_architecture_is_one_line(capsys, tmp_path):
    arch = ("general.architecture", 8, (5).to_bytes(8, "little") + b"llama")
    array = (9).to_bytes(4, "little") + (1).to_bytes(8, "little")  # an array of one array, ...
    nested = ("x", 9, array * 99_999 + (0).to_bytes(4, "little") + (0).to_bytes(8, "little"))
    for name, pairs, words in (("nested", (arch, nested), ["nested.gguf", "nests arrays more than 8 deep"]),
                               ("arch-only", (arch,), ["arch-only.gguf holds no tensors"])):
        code, _, err = run_cli(capsys, "generate", "--model", str(_gguf(tmp_path / f"{name}.gguf", *pairs)),
                               "--prompt", "hi")
        assert_one_line_error(code, err, *words)
        assert "Error:" not in err and code == 2, err  # no exception's name, the exit of bad input


@pytest.mark.parametrize("command", ["bench", "export"])
@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_an_unusable_out_folder_fails_before_the_model_loads(capsys, tmp_path, command, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = blocker if where == "file" else blocker / "sub"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    extra = ["--prompts", str(prompts)] if command == "bench" else []
    # the model does not exist: only a check made before loading can name --out
    code, _, err = run_cli(capsys, command, "--model", "/no/such/model.gguf", "--out", str(out), *extra)
    assert code == 2
    assert_one_line_error(code, err, f"--out {out}", "a file is in the way")


def test_an_empty_prompt_a_prompts_folder_and_a_data_file_are_named_before_the_model_loads(capsys, tmp_path):
    """Each said as what it is (not "not found", not "[Errno 17] File exists"); the model does not exist, so only a
    check made before loading can say it."""
    (data := tmp_path / "answers").write_text("x")
    gone = ["--model", "/no/such/model.gguf"]
    for args, words in ((["generate", "--prompt", ""], ["--prompt is empty"]),
                        (["generate", "--prompt", " \n"], ["--prompt is empty"]),
                        (["generate", "--prompts", str(tmp_path)], [f"{tmp_path} is a folder, not a prompts file"]),
                        (["train-head", "--data", str(data)], [f"training data folder {data} is a file"]),
                        (["train-head", "--kind", "phrases", "--data", str(data)], [f"({data} is a file)"])):
        code, _, err = run_cli(capsys, *args, *gone)
        assert_one_line_error(code, err, *words)
        assert "Errno" not in err and "not found" not in err, err


def test_the_chats_k_command_says_what_is_wrong_with_its_value_not_the_help(capsys):
    from specula.engine.cli.chat import HELP, _with_k

    config = DecodeConfig(k=5)
    for value, words in (("-1", "between 1 and 31, got -1"), ("99", "got 99"), ("", "a whole number (e.g. /k 4)"),
                         ("x", "not 'x'")):
        assert _with_k(config, value) == config
        out = capsys.readouterr().out
        assert words in out and HELP not in out, out
    assert _with_k(config, "3").k == 3 and capsys.readouterr().out.strip() == "[k = 3]"


@pytest.mark.parametrize("args, words", [
    (["--strategies", ""], ["--strategies names no strategy"]),
    (["--strategies", " , "], ["--strategies names no strategy"]),
    (["--limit-per-category", "0"], ["argument --limit-per-category"]),
    (["--limit-per-category", "-1"], ["argument --limit-per-category"]),
])
def test_bench_refuses_empty_strategy_lists_and_limits_below_one(capsys, tmp_path, args, words):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code, _, err = run_cli(capsys, "bench", "--model", "/no/such/model.gguf", "--prompts", str(prompts), *args)
    assert code == 2
    assert_one_line_error(code, err, *words)


# -- every decoding command reads its flags through read_flags: one flag, one check, one wording -----------
# what each decoding command needs besides the flag tried (PROMPTS: a prompts file)
DECODING = {"generate": ["--prompt", "hi"], "chat": [], "bench": ["--prompts", "PROMPTS"],
            "measure-head": ["--prompts", "PROMPTS"]}
STRATEGY_FLAG = {"bench": "--strategies"}  # "--STRATEGY" in a case: the command's strategy flag (bench names several)


@pytest.mark.parametrize("flags, commands, words", [
    (["--k", "0"], DECODING, "draft length k must be between 1 and"),
    (["--k", "40"], DECODING, "draft length k must be between 1 and"),
    (["--k", "two"], DECODING, "argument --k: invalid int value: 'two'"),
    (["--max-new-tokens", "0"], DECODING, "max new tokens must be at least 1, got 0"),
    (["--temperature", "-1"], ("generate", "chat", "bench"), "temperature must be a finite number >= 0"),
    (["--STRATEGY", "warp-drive"], ("generate", "chat", "bench"), "unknown strategy 'warp-drive': choose one of"),
    (["--STRATEGY", "draft-model"], ("generate", "chat", "bench"), "strategy 'draft-model' needs --draft-model"),
])
def test_a_bad_decoding_flag_is_the_same_line_from_every_command(capsys, tmp_path, flags, commands, words):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    lines = set()
    for command in commands:
        args = [STRATEGY_FLAG.get(command, "--strategy") if a == "--STRATEGY" else a for a in flags]
        extra = [str(prompts) if a == "PROMPTS" else a for a in DECODING[command]]
        # the model does not exist: only a check made before it loads can answer
        code, _, err = run_cli(capsys, command, "--model", "/no/such/model.gguf", *extra, *args)
        assert code == 2
        assert_one_line_error(code, err, words)
        lines.add(err.strip().split(" (see specula")[0])  # argparse's line names the command's --help
    assert len(lines) == 1, lines


def test_bench_and_measure_head_build_their_settings_as_generate_does(monkeypatch):
    """The model, the decoding settings and the strategy options, read from each command's parsed flags (no
    model loads): bench's settings for a strategy are generate's for it, greedy and seeded; measure-head's answers
    are plain decoding's, its --k the draft length."""
    from dataclasses import replace

    from specula.engine.cli.bench.command import compiled_step
    from specula.engine.cli.common import read_flags
    from specula.engine.cli.main import build_parser

    def asked(*argv):
        return read_flags(build_parser().parse_args(list(argv)), measure_baseline=False, prepare=False)

    model = ["--model", "m.gguf", "--dtype", "fp32", "--device", "cpu", "--max-new-tokens", "40"]
    generate = {name: asked("generate", "--prompt", "hi", "--strategy", name, "--head", "h", "--chat", *model)
                for name in ("none", "prompt-lookup", "eagle")}
    bench = asked("bench", "--prompts", "p.jsonl", "--head", "h", *model)
    for name, flags in generate.items():  # each strategy's own draft length, as generate gives it
        assert bench.config_for(name) == flags.config  # no seed either: a sampled run draws afresh, as generate's
    assert (bench.load.target, bench.options, bench.chat) == (generate["none"].load.target, (("head", "h"),), True)
    fixed = asked("bench", "--prompts", "p.jsonl", "--k", "3", "--adaptive-k", "--no-chat", *model)
    assert {fixed.config_for(name).k for name in generate} == {3} and fixed.config.adaptive_k and not fixed.chat
    monkeypatch.delenv("SPECULA_STEP", raising=False)
    assert compiled_step(bench.load).target.step == "compiled"  # every row on the step that waits to be built
    measure = asked("measure-head", "--prompts", "p.jsonl", "--k", "3", "--head", "a", "--head", "b", *model)
    assert measure.strategy == "none" and measure.config == replace(generate["none"].config, k=3)
    assert measure.load.target == generate["none"].load.target
    assert measure.options == ()  # its --head names the heads to measure, not the eagle strategy's option


@pytest.mark.parametrize("args, words", [
    (["--port", "70000"], ["argument --port", "between 0 and 65535"]),
    (["--port", "-1"], ["argument --port", "between 0 and 65535"]),
    (["--strategy", "bogus"], ["--strategy bogus", "prompt-lookup"]),
    (["--host", "bad host!"], ["--host 'bad host!' cannot be resolved"]),
    (["--host", "not.a.real.host.invalid"], ["--host 'not.a.real.host.invalid' cannot be resolved"]),
    (["--data-dir", "/dev/null/data"], ["--data-dir /dev/null/data", "cannot keep data there"]),
])
def test_serve_names_the_bad_flag(capsys, args, words):
    pytest.importorskip("uvicorn")
    code, _, err = run_cli(capsys, "serve", "--no-model", *args)
    assert code == 2
    assert_one_line_error(code, err, *words)
    assert "API key" not in err


def test_an_empty_prompt_in_a_prompts_file_names_the_file_and_line(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": ""}\n')
    code, _, err = run_cli(capsys, "generate", "--model", "/no/such/model.gguf", "--prompts", str(prompts))
    assert code == 2
    assert_one_line_error(code, err, f"{prompts} line 2: the prompt is empty")


def test_ctrl_c_stopping_an_answer_is_not_echoed_into_it():
    """The terminal wrote "^C" into the answer Ctrl+C stopped: its echo of control keys is off while an answer
    is written (a pseudo-terminal here), and back as it was after; nothing is done where input is not a terminal."""
    import io
    import os
    import pty
    import termios

    from specula.engine.cli.chat import _quiet_control_keys

    master, slave = pty.openpty()
    try:
        with open(slave, "rb", buffering=0, closefd=False) as stream:
            before = termios.tcgetattr(slave)
            termios.tcsetattr(slave, termios.TCSANOW, before[:3] + [before[3] | termios.ECHOCTL] + before[4:])
            restore = _quiet_control_keys(stream)
            assert not termios.tcgetattr(slave)[3] & termios.ECHOCTL
            restore()
            assert termios.tcgetattr(slave)[3] & termios.ECHOCTL
    finally:
        os.close(master)
        os.close(slave)
    _quiet_control_keys(io.StringIO("not a terminal"))()  # no file number: nothing to do


def test_a_model_file_cut_short_while_the_chat_runs_ends_it_with_one_line_not_a_bus_error(tmp_path):
    """The chat reads the token embedding's rows from the file at every step (a large model's): where the file was
    cut short meanwhile, reading past its new end would end the process with SIGBUS. Every read checks the file
    first, so the chat ends with one line saying why. In a child process: the test's own would die with it."""
    import subprocess
    import sys

    from tests.support.gguf_files import tiny_llama, write_gguf

    model = write_gguf(tmp_path / "m.gguf", tiny_llama(seed=5, layers=1), "Q8_0")
    chat = ("import sys\nfrom specula.engine.models import from_gguf\nfrom specula.engine.cli.main import main\n"
            "from_gguf.EMBED_COPY_BYTES = 0  # its rows read from the file, as a large model's\n"
            "sys.exit(main(sys.argv[1:]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", chat, "chat", "--model", str(model), "--max-new-tokens", "4",
                              "--strategy", "none"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        child.stdin.write("hello\n")
        child.stdin.flush()
        while "[none:" not in (line := child.stdout.readline()):  # the first answer's summary line
            assert line, child.stderr.read()
        os.truncate(model, model.stat().st_size // 2)
        out, err = child.communicate("again\n", timeout=300)
    finally:
        child.kill()
    lines = [line for line in err.splitlines() if not line.startswith("[")]
    assert child.returncode == 2 and lines == [lines[0]], (child.returncode, err)
    assert lines[0].startswith("specula: error: m.gguf changed on disk since it was loaded")


def test_a_data_folder_given_to_a_process_holds_what_it_learns(tmp_path, monkeypatch):
    from specula.engine.api import paths

    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "before"))
    apart = paths.use_data_dir(tmp_path / "apart" / "run-1")  # made where missing
    assert apart.is_dir() and not any(apart.iterdir())  # nothing left behind by the write check
    assert paths.data_dir() == apart.resolve()
    assert paths.corpus_dir().parent == apart.resolve() and paths.conversations_db().parent == apart.resolve()
