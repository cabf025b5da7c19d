"""The model's own phrases (drafters/phrases.py): the counted table, its drafts, what a session learns, the file,
and auto drafting from it without changing a greedy answer."""

import json

import numpy as np
import pytest
import torch

from specula.engine.api.errors import SpeculaError
from specula.engine.api.events import Finished
from specula.engine.api.types import DecodeConfig, SamplingParams
from specula.engine.decoding.drafter import DraftContext
from specula.engine.decoding.loop import generate
from specula.engine.drafters import auto as auto_module
from specula.engine.drafters import build_drafter, phrases
from specula.engine.drafters.auto import Auto
from specula.engine.drafters.phrases import Phrases, PhraseTable, count_runs, run_key, table_for
from specula.engine.heads.config import target_fingerprint
from tests.engine.test_auto_lookahead import drive
from tests.support.tiny import loaded, tiny_model


def test_runs_keep_their_favourite_next_token_where_it_is_clear():
    seqs = [[1, 2, 7], [1, 2, 7], [1, 2, 8], [1, 2, 7],  # after (1, 2): 7 three times of four
            [3, 4, 5], [3, 4, 6], [3, 4, 5], [3, 4, 6],  # after (3, 4): a tie, 5 and 6 twice each
            [9, 9, 1], [9, 9, 1]]  # after (9, 9): seen twice only
    o = count_runs(seqs, 2, min_count=3, min_share=0.5)
    found = {int(k): (int(n), int(c), int(t)) for k, n, c, t in zip(o.keys, o.nexts, o.counts, o.totals)}
    assert found == {run_key([1, 2], 2): (7, 3, 4), run_key([3, 4], 2): (5, 2, 4)}  # a tie: the smaller id
    assert list(o.keys) == sorted(o.keys)
    assert count_runs(seqs, 2, min_count=3, min_share=0.8).keys.shape[0] == 0  # 3 of 4 is not 80%
    # runs never cross from one answer into the next: "7 1" occurs only across answers
    assert run_key([7, 1], 2) not in {int(k) for k in count_runs(seqs * 3, 2, min_count=1, min_share=0).keys}


def test_a_draft_follows_the_longest_run_with_a_clear_favourite():
    seqs = [[5, 1, 2, 3, 4]] * 3 + [[6, 1, 2, 3, 9]] * 3 + [[7, 1, 2, 3, 8]] * 2 + [[0, 2, 3, 4, 5, 6]] * 4
    table = PhraseTable.from_sequences(seqs)
    # (5 1 2 3) -> 4 and (6 1 2 3) -> 9 always; (7 1 2 3) -> 8 seen twice only; (1 2 3) has no clear favourite
    # (4, 9 and 8: 3, 3 and 2 of 8); (2 3) -> 4 seven times of twelve; (2 3 4) -> 5 and (3 4 5) -> 6 always
    assert table.draft([5, 1, 2, 3], 8) == [4, 5, 6]
    assert table.draft([6, 1, 2, 3], 8) == [9]
    assert table.draft([7, 1, 2, 3], 8) == [4, 5, 6]  # from the two-token run
    assert table.draft([5, 1, 2, 3], 2) == [4, 5]  # at most k
    assert table.draft([11, 12], 4) == []  # never seen


def test_a_session_learns_the_answers_it_decodes_and_drafts_them_once_seen_often_enough():
    table = PhraseTable()
    view = Phrases(table)
    prompt = [40, 41, 42, 43, 44]
    answer = [10, 11, 12, 13, 14, 15]
    for _ in range(phrases.MIN_COUNT):
        assert table.draft([10, 11], 8) == []  # seen too few times yet
        view.finished(torch.tensor(prompt + answer), len(prompt))  # an answer ends: learned, to its last token
    assert table.draft([10, 11], 8) == [12, 13, 14, 15]
    # the prompt's last PROMPT_TAIL tokens open the runs, its earlier tokens are never learned
    assert table.draft(prompt[-phrases.PROMPT_TAIL :], 2) == [10, 11]
    assert table.draft([40, 41], 2) == []
    # learned counts join a shipped table's: a shipped favourite is outvoted once it is outnumbered
    shipped = PhraseTable.from_sequences([[1, 2, 3]] * 3)
    assert shipped.draft([1, 2], 1) == [3]
    shipped.learn([1, 2, 4] * 1, 0)
    assert shipped.draft([1, 2], 1) == [3]
    shipped.learn([1, 2, 4, 1, 2, 4, 1, 2, 4], 0)
    assert shipped.draft([1, 2], 1) == [4]


def test_the_table_file_round_trips_and_a_damaged_one_is_refused_in_one_line(tmp_path):
    table = PhraseTable.from_sequences([[1, 2, 3, 4, 5]] * 4 + [[7, 8, 9]] * 3, {"target": "abc"})
    table.save(tmp_path / "t")
    again = PhraseTable.load(tmp_path / "t")
    assert again.runs == table.runs > 0 and again.info["target"] == "abc"
    assert again.draft([1, 2], 8) == table.draft([1, 2], 8) == [3, 4, 5]
    (tmp_path / "t" / phrases.FILE).write_bytes(b"not a table")
    with pytest.raises(SpeculaError) as err:
        PhraseTable.load(tmp_path / "t")
    assert "unreadable" in str(err.value) and "\n" not in str(err.value)
    table.save(tmp_path / "u")
    info = json.loads((tmp_path / "u" / phrases.INFO).read_text())
    (tmp_path / "u" / phrases.INFO).write_text(json.dumps({**info, "format": 99}))
    with pytest.raises(SpeculaError, match="format 99"):
        PhraseTable.load(tmp_path / "u")


def test_a_model_finds_the_table_made_for_it_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path))
    target = loaded(tiny_model(vocab=64, layers=2, seed=0))
    other = loaded(tiny_model(vocab=64, layers=2, seed=1))
    mine = PhraseTable.from_sequences([[1, 2, 3]] * 3, {"target": target_fingerprint(target.model)})
    mine.save(tmp_path / "heads" / "mine")
    assert table_for(target).draft([1, 2], 1) == [3]
    assert table_for(other).runs == 0 and table_for(other).draft([1, 2], 1) == []
    (tmp_path / "heads" / "mine" / phrases.FILE).write_bytes(b"broken")  # passed over, not fatal
    assert table_for(target).runs == 0


def test_the_bundled_model_ships_its_table():
    folder = phrases.phrase_folders()
    shipped = [f for f in folder if f.name == "smollm2-135m-instruct-phrases"]
    assert shipped, folder
    table = PhraseTable.load(shipped[0])
    assert table.info["answer_tokens"] > 3_000_000 and table.runs > 100_000
    for o in table.orders.values():
        assert np.all(o.counts >= phrases.MIN_SHARE * o.totals) and np.all(o.totals >= phrases.MIN_COUNT)


def test_auto_offers_the_phrases_where_prompt_lookup_has_no_longer_match(monkeypatch):
    monkeypatch.setattr(auto_module, "HEADS_AFTER", 0)
    table = PhraseTable.from_sequences([[5, 6, 7, 8, 9, 10]] * 4)
    auto = Auto(phrases=Phrases(table))
    assert auto.members == ("none", "prompt-lookup", "phrases")
    chosen = drive(auto, 30, lambda n: 0.030 + 0.002 * n, {"phrases": 3}, tokens=(1, 2, 5, 6, 7))
    assert chosen[-10:] == ["phrases"] * 10
    # where prompt lookup matches two tokens or more, the phrases are not offered
    chosen = drive(Auto(phrases=Phrases(table)), 12, lambda n: 0.030, {"phrases": 3}, tokens=(5, 6, 7, 1, 5, 6, 7))
    assert "phrases" not in chosen
    # with a seed the steps must not depend on what was learned before: no phrases
    chosen = drive(Auto(phrases=Phrases(table)), 6, lambda n: 0.030, {"phrases": 3}, (1, 2, 5, 6, 7), timed=False)
    assert chosen == ["none"] * 6
    assert "phrases" not in Auto.build(None, skip="phrases").members
    assert "phrases" not in Auto.build(None, phrases=False).members


def test_auto_drafting_the_models_phrases_keeps_greedy_answers_token_for_token(monkeypatch):
    """A table of the tiny model's own answers (its drafts mostly right) and one whose runs are followed by other
    tokens (rejected): auto's answers are `none`'s token for token either way."""
    monkeypatch.setattr(auto_module, "HEADS_AFTER", 0)
    target = loaded(tiny_model(vocab=64, layers=4, seed=0))
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 64, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen).tolist()
               for _ in range(8)]
    config = DecodeConfig(k=4, max_new_tokens=40)

    def answer(drafter, prompt):
        finished = list(generate(target.new_runner(), drafter, prompt, config))[-1]
        assert isinstance(finished, Finished)
        return finished

    plain = [answer(build_drafter("none", target), p) for p in prompts]
    answers = [p[-3:] + list(f.token_ids) for p, f in zip(prompts, plain)]
    own = PhraseTable.from_sequences(answers * 3)
    # the same runs, each followed by another token than the model's
    wrong = PhraseTable.from_sequences([[a[i - 2], a[i - 1], (a[i] + 1) % 64]
                                        for a in answers for i in range(2, len(a))] * 3)
    for table, own_answers in ((own, True), (wrong, False)):
        auto = Auto(phrases=Phrases(table), use_lookup=False)
        drafted = accepted = 0
        for p, base in zip(prompts, plain):
            auto.reset()
            spec = answer(auto, p)
            assert spec.token_ids == base.token_ids
            drafted += spec.totals.drafted
            accepted += spec.totals.accepted
        assert drafted > 0
        # the wrong table's drafts are rejected until what the answers taught the session outvotes them
        assert accepted > drafted / 2 if own_answers else accepted < drafted


def test_train_head_counts_the_phrases_of_a_data_folder_for_the_model_that_finds_them(capsys, tiny_folder, tmp_path,
                                                                                      monkeypatch):
    from tests.engine.test_cli import assert_one_line_error, run_cli

    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "home"))
    data = tmp_path / "data"
    data.mkdir()
    lines = [{"prompt": [7, 8, 9, 1, 2], "answer": [30, 31, 32, 33], "index": i} for i in range(3)]
    (data / "answers.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    count = ("train-head", "--model", str(tiny_folder), "--kind", "phrases")
    code, out, err = run_cli(capsys, *count, "--data", str(data))
    assert code == 0, err
    assert "phrase table saved to" in out and "from 3 answers (12 answer tokens)" in out
    from specula.engine.api.types import ModelChoice
    from specula.engine.models.loading import load_model

    table = table_for(load_model(ModelChoice(str(tiny_folder))))  # found in the user's heads folder
    assert table.draft([9, 1, 2], 8) == [30, 31, 32, 33]
    # again into the same folder: refused unless asked; no data folder, or one without answers: one line each
    code, _, err = run_cli(capsys, *count, "--data", str(data))
    assert_one_line_error(code, err, "is not empty", "--overwrite")
    code, _, err = run_cli(capsys, *count)
    assert_one_line_error(code, err, "--data")
    code, _, err = run_cli(capsys, *count, "--data", str(tmp_path), "--out", str(tmp_path / "elsewhere"))
    assert_one_line_error(code, err, "no answers in")


def test_autos_choice_is_named_on_the_tokens_of_its_steps_and_crosses_the_wire():
    from specula.engine.api.events import Origin, Token
    from specula.engine.api.wire import token_from, token_json

    target = loaded(tiny_model(vocab=64, layers=2, seed=0))
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]  # repeats: prompt lookup has matches
    auto_table = PhraseTable()
    events = list(generate(target.new_runner(), Auto(phrases=Phrases(auto_table)), prompt,
                           DecodeConfig(k=4, max_new_tokens=30)))
    steps = [e for e in events if hasattr(e, "tokens") and e.step > 0]
    drafting = [s for s in steps if s.drafted]
    assert drafting and all(t.drafter and t.drafter.startswith("prompt lookup (a match of")
                            for s in drafting for t in s.tokens + s.rejected)
    assert all(t.drafter is None for s in steps if not s.drafted for t in s.tokens)
    answer = next(e for e in events if hasattr(e, "totals")).token_ids
    learned = auto_table.learned  # the whole answer, its last token too, once it ended
    assert learned and any(answer[-1] in counts for counts in learned.values())
    plain = list(generate(target.new_runner(), build_drafter("prompt-lookup", target), prompt,
                          DecodeConfig(k=4, max_new_tokens=30)))
    assert all(t.drafter is None for e in plain if hasattr(e, "tokens") for t in e.tokens)  # a single strategy
    token = Token(3, "x", Origin.DRAFT, 2, 0, branch=None, drafter="the model's own phrases")
    assert token_from(token_json(token), 2) == token


def test_autos_drafts_are_its_members_own():
    """auto finds the match once a step and looks the phrases up only when it picks them: what it drafts is
    what prompt lookup and the phrase table draft themselves, at the length it chose."""
    from specula.engine.drafters.prompt_lookup import PromptLookup

    table = PhraseTable.from_sequences([[5, 6, 7, 8, 9, 10, 11, 12, 13]] * 4)
    gen = torch.Generator().manual_seed(1)
    seen = set()
    for trial in range(60):
        tokens = torch.randint(5, 9 + trial % 6, (4 + trial % 30,), generator=gen)
        ctx = DraftContext(tokens, 2, SamplingParams(), None, plain_s=0.03, timed=True)
        auto = Auto(phrases=Phrases(table))
        for _ in range(8):  # its first drafts: each choice at full length while it is measured
            draft = auto.propose(ctx, 6).tokens.tolist()
            length = len(draft)
            if auto.chosen.startswith("prompt-lookup"):
                assert draft == PromptLookup().propose(ctx, 6).tokens.tolist()[:length] and length > 0
            elif auto.chosen == "phrases":
                assert draft == table.draft(tokens[-4:].tolist(), length) and length > 0
            seen.add(auto.chosen.split(":")[0])
            auto.observe(0, 0)
            auto.observe_step(length, 0, 0.03 + 0.001 * length)
    assert {"prompt-lookup", "phrases"} <= seen
