"""`suffix`: continuations from the conversation and the model's earlier answers, scored by how often each
followed; the corpus kept across sessions and bounded; auto takes it as a member."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from specula.engine.api.types import DecodeConfig, SamplingParams
from specula.engine.decoding.drafter import DraftContext
from specula.engine.decoding.loop import generate
from specula.engine.drafters import build_drafter
from specula.engine.drafters import answer_history
from specula.engine.drafters import suffix as suffix_module
from specula.engine.drafters.suffix import Suffix, SuffixIndex
from tests.support.tiny import loaded, tiny_model


def context(tokens, prompt_len=1, tree=False):
    runner = type("Runner", (), {"exact_trees": True, "device": torch.device("cuda")})() if tree else None
    return DraftContext(torch.tensor(tokens), prompt_len, SamplingParams(), None, runner)


def test_the_draft_follows_what_most_often_followed_and_a_tree_holds_the_runners_up():
    index = SuffixIndex()
    for answer in ([9, 1, 2, 3, 4, 5], [8, 1, 2, 3, 4, 6], [7, 1, 2, 3, 7]):
        index.add(answer)
    drafter = Suffix(index)
    chain = drafter.propose(context([20, 1, 2, 3]), 8)
    assert chain.parents is None and chain.tokens.tolist() == [4, 5]  # 4 in two of three; 5 and 6 tie: the first id
    tree = drafter.propose(context([20, 1, 2, 3], tree=True), 8)
    tokens, parents = tree.tokens.tolist(), tree.parents
    assert tokens[0] == 4 and parents[0] == -1 and set(tokens[1:]) <= {5, 6, 7}
    assert all(p < i for i, p in enumerate(parents))  # parents come first
    assert drafter.match == 3 and len(tokens) <= 3  # nodes: the longest match's length
    assert drafter.propose(context([20, 30, 40]), 8).tokens.numel() == 0  # nowhere: nothing


def test_the_conversation_itself_is_searched_too():
    drafter = Suffix(SuffixIndex())
    draft = drafter.propose(context([5, 6, 7, 8, 9, 1, 5, 6, 7]), 8)
    assert draft.tokens.tolist()[:2] == [8, 9]


def test_an_earlier_answer_is_drafted_again_and_the_answer_stays_the_targets():
    target = loaded(tiny_model(vocab=64, layers=2, seed=5))
    drafter = build_drafter("suffix", target)
    drafter.index = SuffixIndex()  # this test's own corpus
    prompt = [3, 14, 15, 9, 26, 5]
    config = DecodeConfig(k=8, adaptive_k=True, k_max=8, max_new_tokens=60)  # drafts of k whatever they cost
    base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
    first = list(generate(target.new_runner(), drafter, prompt, config))[-1]
    again = list(generate(target.new_runner(), drafter, prompt, config))[-1]  # asked again, a new conversation
    assert first.token_ids == base.token_ids
    assert again.totals.accepted > again.totals.new_tokens // 2  # the first answer, drafted from the corpus
    assert again.totals.accepted > first.totals.accepted


def test_the_corpus_is_kept_across_sessions_bounded_and_a_damaged_one_starts_again(tmp_path, monkeypatch):
    path = tmp_path / "suffix" / "model.npz"
    index = SuffixIndex(path)
    index.add([1, 2, 3, 4, 5])
    index.add([6, 1, 2, 3, 9])
    index.save()
    again = SuffixIndex(path)
    assert np.array_equal(again.tokens, index.tokens) and again.note == ""
    assert sorted(again.occurrences(np.array([1, 2, 3])).tolist()) == sorted(index.occurrences(np.array([1, 2, 3])).tolist())
    path.write_bytes(b"not a corpus")
    damaged = SuffixIndex(path)
    assert len(damaged) == 0 and "was not read" in damaged.note
    monkeypatch.setattr(suffix_module, "MAX_TOKENS", 40)
    small = SuffixIndex()
    for i in range(12):
        small.add([100 + i, 1, 2, 3, 200 + i])
    assert len(small) <= 40 and 211 in small.tokens and 200 not in small.tokens  # the oldest left first
    ends = small.occurrences(np.array([1, 2, 3]))
    assert ends.size and all(small.tokens[e + 1] >= 200 for e in ends)  # the index follows the corpus


def test_auto_drafts_from_the_earlier_answers_and_names_them():
    target = loaded(tiny_model(vocab=64, layers=2, seed=5))
    auto = build_drafter("auto", target, skip="prompt-lookup,lookahead,phrases")
    assert "suffix" in auto.members
    auto.suffix.index = SuffixIndex()
    prompt = [3, 14, 15, 9, 26, 5]
    config = DecodeConfig(k=8, max_new_tokens=60)
    base = list(generate(target.new_runner(), build_drafter("none", target), prompt, config))[-1]
    list(generate(target.new_runner(), auto, prompt, config))
    events = list(generate(target.new_runner(), auto, prompt, config))
    assert events[-1].token_ids == base.token_ids
    drafters = {t.drafter for e in events[1:-1] if hasattr(e, "tokens") for t in e.tokens if t.drafter}
    assert "the model's earlier answers" in drafters
    assert "suffix" not in build_drafter("auto", target, skip="suffix").members


@pytest.mark.parametrize("tree", [False, True])
def test_greedy_answers_stay_the_targets_own_with_chains_and_trees(tree):
    from tests.support.tiny import assert_greedy_identity

    target = loaded(tiny_model(vocab=64, layers=2, seed=6))
    assert_greedy_identity(target, None, "suffix", {"tree": tree}, trials=8, longest_prompt=30, max_new_tokens=50)


def test_a_lost_or_damaged_corpus_is_rebuilt_from_the_conversation_history(tmp_path, monkeypatch, bundled_fp32):
    """A model without a corpus (a new model, or its file lost or damaged) starts from the finished answers in the
    window's history, tokenized again after the chat template's opening of an answer; the history is only read."""
    from specula.app.history import Conversation, Turn
    from specula.app.history_db import ConversationDB

    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(suffix_module, "_INDEXES", {})
    monkeypatch.setattr(suffix_module, "_APART", False)  # a bench run earlier in this process keeps corpora apart
    answer = "The heron waited by the mill race until the light went grey over the water meadows."
    history = tmp_path / "conversations.db"
    db = ConversationDB(history)
    db.save(Conversation("c1", turns=(Turn("user", "A line, please."), Turn("assistant", answer),
                                      Turn("user", "Another."), Turn("assistant", "Cut short by a kill", interrupted=True))))
    db.close()
    before = history.read_bytes()
    index = suffix_module.index_for(bundled_fp32)
    assert index.note == "the suffix corpus was rebuilt from 1 answers in the conversation history"
    assert history.read_bytes() == before
    tokenizer = bundled_fp32.tokenizer
    ids = tokenizer.encode(answer, add_special_tokens=False)
    opening = answer_history._answer_opening(tokenizer)
    assert len(opening) == suffix_module.PROMPT_TAIL and index.tokens.tolist() == opening + ids + [-1]
    drafter = suffix_module.Suffix(index, tree=False)
    drafter.match = 0
    assert drafter.candidates(torch.tensor(opening + ids[:5])).chain(8) == ids[5:13]  # the answer, drafted again
    index.save()
    monkeypatch.setattr(suffix_module, "_INDEXES", {})
    assert suffix_module.index_for(bundled_fp32).note == ""  # read from its file: nothing rebuilt
    index.path.write_bytes(b"damaged")
    monkeypatch.setattr(suffix_module, "_INDEXES", {})
    again = suffix_module.index_for(bundled_fp32)
    assert "was not read" in again.note and again.note.endswith("rebuilt from 1 answers in the conversation history")
    assert again.tokens.tolist() == index.tokens.tolist()
    history.write_bytes(b"not a database")
    assert suffix_module.earlier_answers(history) == []


def _steps(events):
    return [(e.drafted, e.accepted) for e in events if hasattr(e, "drafted")]


def test_an_answer_left_out_is_drafted_as_before_it_was_learned_and_a_run_that_does_not_learn_adds_nothing():
    """Compare re-creates the user's answer: its runs draft from what was known before that answer (leave_out)
    and add nothing (learn=False), so the same Compare twice takes the same steps; without leave_out the answer
    is drafted from the corpus."""
    target = loaded(tiny_model(vocab=64, layers=2, seed=5))
    drafter = build_drafter("suffix", target)
    drafter.index = SuffixIndex()
    drafter.index.add([7, 3, 14, 15, 9, 26, 5, 8, 8, 30])  # an earlier answer of another prompt
    prompt = [3, 14, 15, 9, 26, 5]
    # seeded sampling takes the same steps every time (its plain probes at fixed gaps), whatever the clock says
    seeded = DecodeConfig(k=8, adaptive_k=True, k_max=8, max_new_tokens=60, seed=11,
                          params=SamplingParams(temperature=0.3))
    quiet = replace(seeded, learn=False)
    before = list(generate(target.new_runner(), drafter, prompt, quiet))
    assert len(drafter.index) == 11  # nothing learned
    answer = list(generate(target.new_runner(), drafter, prompt, seeded))[-1]  # the user's answer: learned
    assert answer.token_ids == before[-1].token_ids and len(drafter.index) > 11
    compare = replace(quiet, leave_out=(answer.token_ids,))
    first = list(generate(target.new_runner(), drafter, prompt, compare))
    again = list(generate(target.new_runner(), drafter, prompt, compare))
    assert _steps(first) == _steps(before) == _steps(again)
    assert first[-1].token_ids == before[-1].token_ids
    assert np.array_equal(drafter.index.visible, drafter.index.tokens)  # shown again after the answer
    greedy = DecodeConfig(k=8, adaptive_k=True, k_max=8, max_new_tokens=60, learn=False)
    list(generate(target.new_runner(), drafter, prompt, replace(greedy, learn=True)))  # a greedy answer, learned
    told = list(generate(target.new_runner(), drafter, prompt, greedy))[-1]
    hidden = list(generate(target.new_runner(), drafter, prompt, replace(greedy, leave_out=(told.token_ids,))))[-1]
    assert told.totals.accepted > told.totals.new_tokens // 2  # the learned answer, drafted from the corpus
    assert hidden.totals.accepted < told.totals.accepted


def test_hiding_leaves_out_every_stretch_an_answer_holds_and_nothing_else():
    index = SuffixIndex()
    index.add([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    index.add([40, 41, 42, 1, 2, 3, 50])  # shares only 3 tokens with the answer: kept
    with index.hiding([[0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99]]):  # tokenized again: its ends differ
        assert index.visible[1:11].tolist() == [-1] * 10 and index.visible[0] == 1 and index.visible[11] == 12
        assert index.visible[13:].tolist() == index.tokens[13:].tolist()
        assert index.occurrences(np.array([1, 2, 3])).tolist() == [18]  # the other answer's only
    assert index.visible is index.tokens


def test_auto_leaves_out_an_answer_in_its_members_that_learn():
    target = loaded(tiny_model(vocab=64, layers=2, seed=5))
    auto = build_drafter("auto", target, skip="prompt-lookup,lookahead")
    auto.suffix.index = SuffixIndex()
    prompt = [3, 14, 15, 9, 26, 5]
    answer = list(generate(target.new_runner(), auto, prompt, DecodeConfig(k=8, max_new_tokens=40)))[-1]
    learned = {key: dict(seen) for key, seen in auto.phrases.table.learned.items()}
    assert learned
    with auto.leaving_out([list(prompt[-3:]) + list(answer.token_ids)]):
        assert auto.suffix.index.occurrences(np.array(answer.token_ids[:3])).size == 0
        assert all(count == 0 for seen in auto.phrases.table.learned.values() for count in seen.values())
    assert auto.phrases.table.learned == learned
    # a whole answer drafted with it left out: the counts it leaves at nothing are passed over, then come back
    config = DecodeConfig(k=8, max_new_tokens=40, learn=False, leave_out=(tuple(prompt[-3:]) + answer.token_ids,))
    policy = {name: repr(vars(m)) for name, m in auto.models.items()}, auto.steps
    again = list(generate(target.new_runner(), auto, prompt, config))[-1]
    assert again.token_ids == answer.token_ids and auto.phrases.table.learned == learned
    # nor does what auto learned of how well each choice drafts change: the next answer drafts as before
    assert ({name: repr(vars(m)) for name, m in auto.models.items()}, auto.steps) == policy
    list(generate(target.new_runner(), auto, prompt, DecodeConfig(k=8, max_new_tokens=40)))
    assert auto.steps > policy[1]  # an answer that learns moves them


def test_a_run_that_does_not_learn_and_leaves_answers_out_crosses_the_wire():
    from specula.engine.api.prompts import Message
    from specula.engine.api.types import GenerateRequest
    from specula.engine.api.wire import extension_json, request_body
    from specula.engine.serving.faults import ApiError
    from specula.engine.serving.openai import Defaults, parse_chat

    config = DecodeConfig(learn=False, leave_out=("an earlier answer", (5, 6, 7)))
    request = GenerateRequest((Message("user", "hi"),), "auto", config)
    body = {**request_body(request), "specula": extension_json(request)}
    defaults = Defaults(("tiny",), ("none", "auto"))
    parsed = parse_chat(body, defaults).request.config
    assert parsed.learn is False and parsed.leave_out == config.leave_out
    plain = parse_chat({"messages": [{"role": "user", "content": "hi"}]}, defaults).request.config
    assert plain.learn is True and plain.leave_out == ()
    with pytest.raises(ApiError, match="leave_out"):
        parse_chat({**body, "specula": {"leave_out": "not a list"}}, defaults)


def test_a_deleted_chat_leaves_the_corpus_and_a_cleared_corpus_stays_clear(tmp_path, monkeypatch, bundled_fp32):
    """The corpus outlives a conversation, kept per model in the data folder; deleting a chat makes it again from
    the history that remains (at the next answer: `reset`), and clearing it leaves out every answer before then,
    across restarts too; the phrases' learned counts start again where answers left the history."""
    from specula.app.history import Conversation, Turn
    from specula.app.history_db import ConversationDB
    from specula.engine.drafters.phrases import table_for

    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(suffix_module, "_INDEXES", {})
    monkeypatch.setattr(suffix_module, "_APART", False)
    kept = "The heron waited by the mill race until the light went grey over the water meadows."
    gone = "Seven lanterns swung above the harbour wall while the ferry turned for the island."
    db = ConversationDB(tmp_path / "conversations.db")
    for cid, answer in (("keep", kept), ("gone", gone)):
        db.save(Conversation(cid, turns=(Turn("user", "A line, please."), Turn("assistant", answer))))
    tokenizer = bundled_fp32.tokenizer
    opening = answer_history._answer_opening(tokenizer)
    ids = {text: tokenizer.encode(text, add_special_tokens=False) for text in (kept, gone)}

    def drafts(index, text):  # what the corpus drafts after the answer's first five tokens
        drafter = Suffix(index, tree=False)
        found = drafter.candidates(torch.tensor(opening + ids[text][:5]))
        return found.chain(8) if found is not None else []

    index = suffix_module.index_for(bundled_fp32)
    assert drafts(index, gone) == ids[gone][5:13] and drafts(index, kept) == ids[kept][5:13]
    table = table_for(bundled_fp32)
    table.learn(ids[gone], 1)
    db.delete("gone")
    Suffix(index).reset()  # the next answer
    assert drafts(index, gone) == [] and drafts(index, kept) == ids[kept][5:13]
    assert "answers left the history" in index.note
    table.sync()
    assert table.learned == {}
    monkeypatch.setattr(suffix_module, "_INDEXES", {})
    again = suffix_module.index_for(bundled_fp32)  # a restart reads the file the deletion wrote
    assert again.note == "" and again.tokens.tolist() == index.tokens.tolist()
    db.clear_corpus()
    Suffix(again).reset()
    assert len(again) == 0
    again.add(opening + ids[gone])  # an answer after the clearing is learned as before
    again.save()
    monkeypatch.setattr(suffix_module, "_INDEXES", {})
    after = suffix_module.index_for(bundled_fp32)
    assert drafts(after, kept) == [] and drafts(after, gone) == ids[gone][5:13]
    db.close()
