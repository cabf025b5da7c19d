"""The training prompts and answers for draft heads (engine/heads/documents.py, heads/train/): long texts
from what ships on the machine (Python's documentation, package READMEs, licences, manual pages), pasted
with a task; answers greedy and sampled, the same for a seed."""

import random

import pytest
import torch

from specula.engine.api.types import ModelChoice, SamplingParams
from specula.engine.decoding.batched import LoopDecoder
from specula.engine.decoding.sampling import process_logits, top_p_prefix
from specula.engine.heads import documents
from specula.engine.heads.documents import MAX_CHARS, MIN_CHARS, Document, document_prompt
from specula.engine.heads.train import DOCUMENT_SHARE, prompt_conversations, self_distill
from specula.engine.heads.train.distill import SAMPLING, batched_answers
from specula.engine.models.loading import load_model
from tests.support.tiny import native, tiny_model

GREEDY = SamplingParams()
SAMPLED = SamplingParams(SAMPLING["temperature"], 0, SAMPLING["top_p"])  # training's sampled answers

MAN_PAGE = r'''.\" a comment
.TH DEMO 1
.SH NAME
demo \- show what a manual page holds
.SH OPTIONS
.IP "\fB\-v\fR, \fB\-\-verbose\fR" 4
Say more about
.B each
step.
.TP
.B \-q
Say \fIless\fP.
.IP "\(bu" 2
a bullet
'''


def test_a_manual_page_loses_its_markup_and_keeps_its_options():
    text = documents._roff_text(MAN_PAGE)
    assert "comment" not in text and ".TH" not in text and "\\f" not in text and "\\(bu" not in text
    assert "-v, --verbose" in text and "Say more about\neach\nstep." in text and "-q" in text and "Say less." in text
    assert text.splitlines()[0] == "NAME"


def test_python_documentation_is_read_from_the_sources_as_pydoc_lays_it_out():
    docs = dict(documents.python_docs())
    assert "json" in docs and "dumps(obj, *, skipkeys=False" in docs["json"]
    assert "class TextWrapper" in docs["textwrap"] and "\n    fill(self, text)" in docs["textwrap"]


def test_shipped_documents_come_from_several_sources_and_fit_the_size():
    docs = documents.shipped_documents(seed=1)
    kinds = {d.source.split(":")[0] for d in docs}
    assert {"python", "readme"} <= kinds  # licences and manual pages where the machine has them
    assert len(docs) >= 100
    assert all(MIN_CHARS <= len(d.text) <= MAX_CHARS for d in docs)
    assert [d.source for d in documents.shipped_documents.__wrapped__(seed=1)] == [d.source for d in docs]


def test_prompts_paste_documents_at_their_share():
    docs = [Document(f"test:{i}", f"Document number {i}. " * 60) for i in range(5)]
    convs = prompt_conversations(400, seed=2, documents=docs)
    pasted = [c for c in convs if "Document number" in c[0].content]
    assert abs(len(pasted) / len(convs) - DOCUMENT_SHARE) < 0.08
    assert prompt_conversations(400, seed=2, documents=docs) == convs
    rng = random.Random(0)
    prompt = document_prompt(docs[0], rng)
    assert prompt.count("Document number 0.") == 60 and prompt.strip().endswith((".", "?"))


@pytest.fixture(scope="module")
def tiny_target(tiny_folder):
    return load_model(ModelChoice(str(tiny_folder), "cpu", "fp32"))


@pytest.mark.usefixtures("one_torch_thread")
def test_sampled_answers_repeat_for_a_seed_and_differ_from_greedy_ones(tiny_target):
    def answers(sampled):
        made = self_distill(tiny_target, 40, max_new=10, batch=4, seed=3, sampled=sampled)
        return [a.answer for a in made]

    sampled = answers(1.0)
    assert sampled == answers(1.0)
    assert sampled != answers(0.0)


def test_the_top_p_prefix_is_the_full_distribution():
    """Batched sampled answers draw from each row's most likely tokens: over them the probabilities are
    sampling.process_logits's, and a row whose prefix cannot reach top-p says so."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3000, generator=gen) * torch.tensor([8.0, 4.0, 2.0, 1.0, 0.5, 0.0])[:, None]
    params = SamplingParams(0.8, 0, 0.95)
    ids, kept, covered = top_p_prefix(logits, params, prefix=256)
    full = process_logits(logits, params)
    assert covered[:2].all() and not covered[-1]  # sharp rows fit in the prefix; the flat one does not
    for b in range(6):
        if covered[b]:
            ours = torch.zeros(3000).scatter(0, ids[b], kept[b])
            assert torch.allclose(ours, full[b], atol=1e-6), b
            assert int((full[b] > 0).sum()) < 256


@pytest.mark.parametrize("sampling", [False, True])
def test_batched_answers_are_the_models_own_answers(ops, sampling):
    """Training answers decoded many at once through the compiled step (rows refilled as answers end)
    are, greedily, the answers plain decoding gives each prompt alone; sampled ones repeat for a seed."""
    target = native(tiny_model(vocab=64, layers=2, seed=12))
    target.step = "compiled"
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(4, 64, (n,), generator=gen).tolist() for n in (1, 5, 9, 20, 33, 2, 7)]
    unended = LoopDecoder(target).answer(prompts, 24, GREEDY, 11, lambda: False)
    eos = unended[0][6]  # a token the first greedy answer holds midway ends answers from now on
    target.eos_ids = frozenset({eos})
    batched = batched_answers(target, None, rows=3)
    params = SAMPLED if sampling else GREEDY
    made = batched.answer(prompts, 24, params, seed=11, should_stop=lambda: False)
    assert len(made) == len(prompts) and all(1 <= len(a) <= 24 for a in made)
    if not sampling:
        assert any(a[-1] == eos for a in made) and any(len(a) == 24 for a in made)  # both ways of ending
    assert all(r.compiled for r in batched.runners) and len(batched.runners) == 3
    if sampling:
        assert made == batched_answers(target, None, rows=2).answer(prompts, 24, SAMPLED, 11, lambda: False)
        assert made != batched.answer(prompts, 24, SAMPLED, 12, lambda: False)
    else:
        cut = [a[:-1] if a[-1] == eos else a for a in made]  # one at a time, an answer leaves out its end token
        assert cut == LoopDecoder(target).answer(prompts, 24, GREEDY, 11, lambda: False)


def test_features_kept_while_answering_are_the_feature_passes(ops, tmp_path):
    """An EAGLE-3 head's features kept by batched decoding as each answer is made: laid out as the separate
    pass over the conversation lays them out, with the same states (up to the rounding of another kernel),
    the target's first choices being a greedy answer's tokens, and stored where that pass finds them."""
    from specula.engine.heads.train.answers import Answer
    from specula.engine.heads.train.features import features_of, kept_sequence, store_sequence, stored_sequence

    target = native(tiny_model(vocab=64, layers=4, seed=12))
    target.step = "compiled"
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(4, 64, (n,), generator=gen).tolist() for n in (1, 5, 9, 20, 300, 7)]  # one past EAGLE3_CONTEXT
    unended = LoopDecoder(target).answer(prompts, 24, GREEDY, 11, lambda: False)
    target.eos_ids = frozenset({unended[0][6]})  # some answers end with it, others at 24 tokens
    layers = (0, 2, 3)
    batched = batched_answers(target, None, rows=3, aux_layers=layers)
    made = batched.answer(prompts, 24, GREEDY, 11, lambda: False)
    assert sorted(batched.features) == list(range(len(prompts)))
    ended = 0
    for j, (prompt, row) in enumerate(zip(prompts, made)):
        answer = row[:-1] if row[-1] in target.eos_ids else row
        ended += len(answer) < len(row)
        a = Answer(prompt, answer)
        kept = kept_sequence(target, a, layers, batched.features[j])
        ref = features_of(target, prompt, answer, layers)
        assert torch.equal(kept.tokens, ref.tokens) and kept.answer_start == ref.answer_start
        assert kept.features.shape == ref.features.shape and kept.top_ids.shape == ref.top_ids.shape
        scale = float(ref.features.float().abs().max())
        read = slice(0, -1) if len(answer) == len(row) else slice(None)  # an answer cut at 24: its last token unread
        assert torch.allclose(kept.features[read].float(), ref.features[read].float(), atol=0.02 * scale), j
        assert kept.top_ids[kept.answer_start - 1 : -1, 0].tolist() == answer  # a greedy answer: the first choices
        if len(answer) == len(row):
            assert not kept.features[-1].any()
        store_sequence(tmp_path / f"{j:06d}.pt", kept)
        assert stored_sequence(tmp_path / f"{j:06d}.pt", target, a, layers) is not None  # the feature pass reads it
    assert 0 < ended < len(prompts)


def _write_mo(path, messages: dict[str, str]) -> None:
    """A GNU message catalog (.mo) holding `messages` (the format gettext reads: sorted ids, two tables)."""
    import struct

    keys = sorted(messages)
    ids, strs = b"", b""
    offsets = []
    for k in keys:
        kb, vb = k.encode(), messages[k].encode()
        offsets.append((len(ids), len(kb), len(strs), len(vb)))
        ids += kb + b"\0"
        strs += vb + b"\0"
    start = 7 * 4 + 16 * len(keys)
    table_ids, table_strs = b"", b""
    for io, il, so, sl in offsets:
        table_ids += struct.pack("<II", il, start + io)
        table_strs += struct.pack("<II", sl, start + len(ids) + so)
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), 7 * 4, 7 * 4 + 8 * len(keys), 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + table_ids + table_strs + ids + strs)


def test_sentences_to_translate_into_english_come_from_the_message_catalogs(tmp_path):
    _write_mo(tmp_path / "de" / "LC_MESSAGES" / "demo.mo", {
        "": "Content-Type: text/plain; charset=UTF-8\n",
        "The file could not be opened because it is locked": "Die Datei konnte nicht geöffnet werden, weil sie gesperrt ist",
        "cannot open %s for reading today": "%s kann heute nicht zum Lesen geöffnet werden",  # a format code
        "Quit": "Beenden",  # too short
        "Show the hidden files in every folder of this view": "Zeige die versteckten Dateien in jedem Ordner dieser Ansicht",
    })
    _write_mo(tmp_path / "fr" / "LC_MESSAGES" / "demo.mo", {
        "": "Content-Type: text/plain; charset=UTF-8\n",
        "Please wait while the package list is being updated": "Veuillez patienter pendant la mise à jour de la liste des paquets",
    })
    (tmp_path / "es" / "LC_MESSAGES").mkdir(parents=True)
    (tmp_path / "es" / "LC_MESSAGES" / "broken.mo").write_bytes(b"not a catalog")  # skipped, not fatal
    found = documents.catalog_sentences(seed=3, root=tmp_path)
    assert sorted(found) == [
        ("French", "Veuillez patienter pendant la mise à jour de la liste des paquets"),
        ("German", "Die Datei konnte nicht geöffnet werden, weil sie gesperrt ist"),
        ("German", "Zeige die versteckten Dateien in jedem Ordner dieser Ansicht"),
    ]
    assert documents.catalog_sentences(seed=3, root=tmp_path) == found
    assert documents.catalog_sentences(root=tmp_path / "missing") == []
    prompt = documents.translation_prompt(*found[0], random.Random(0))
    assert found[0][1] in prompt and "English" in prompt


def test_prompts_ask_for_translations_into_english_and_short_questions_at_their_share():
    sentences = [("German", f"Das ist der Satz Nummer {i} zum Übersetzen.") for i in range(50)]
    subjects = {"country": ["Atlantis", "Utopia"], "command": ["frobnicate"]}
    convs = [c[0].content for c in prompt_conversations(2000, seed=4, documents=[], sentences=sentences, subjects=subjects)]
    to_english = [c for c in convs if "zum Übersetzen" in c]
    questions = [c for c in convs if any(s in c for s in ("Atlantis", "Utopia", "frobnicate"))]
    assert abs(len(to_english) / len(convs) - 0.08) < 0.03
    assert abs(len(questions) / len(convs) - 0.09) < 0.03
    assert all(len(q) < 80 and q.endswith("?") for q in questions)
    # without those sources, their share goes to topics x task forms: no empty or broken prompt
    bare = [c[0].content for c in prompt_conversations(500, seed=4, documents=[], sentences=[], subjects={})]
    assert all(len(c) > 10 for c in bare) and not any("zum Übersetzen" in c for c in bare)


def test_some_pasted_texts_come_after_their_task():
    doc = Document("test:0", "Paragraph of the pasted text. " * 30)
    prompts = [document_prompt(doc, random.Random(i)) for i in range(300)]
    first = [p for p in prompts if not p.startswith("Paragraph") and p.rstrip().endswith("pasted text.")]
    assert abs(len(first) / len(prompts) - documents.TASK_FIRST_SHARE) < 0.1
    assert all(p.count("Paragraph of the pasted text.") == 30 for p in prompts)


def test_some_first_turns_are_left_for_the_model_to_write():
    from specula.engine.heads.train import MODEL_QUERY, MODEL_QUERY_SHARE

    convs = [c[0].content for c in prompt_conversations(2000, seed=4, documents=[], sentences=[], subjects={})]
    assert abs(convs.count(MODEL_QUERY) / len(convs) - MODEL_QUERY_SHARE) < 0.03
    docs = [Document(f"test:{i}", f"Document number {i}. " * 60) for i in range(5)]
    convs = [c[0].content for c in prompt_conversations(2000, seed=4, documents=docs)]
    assert abs(convs.count(MODEL_QUERY) / len(convs) - (1 - DOCUMENT_SHARE) * MODEL_QUERY_SHARE) < 0.03


def test_the_share_the_model_writes_can_be_chosen_and_the_other_kinds_keep_their_proportions():
    from specula.engine.heads.train import MODEL_QUERY, MODEL_QUERY_SHARE

    def firsts(written):
        return [c[0].content for c in prompt_conversations(3000, seed=5, documents=[], sentences=[], subjects={},
                                                           written=written)]

    default = firsts(None)
    assert firsts(MODEL_QUERY_SHARE) == default  # the default's conversations, as earlier runs made them
    assert set(firsts(1.0)) == {MODEL_QUERY} and MODEL_QUERY not in firsts(0.0)
    more = firsts(0.6)
    assert abs(more.count(MODEL_QUERY) / len(more) - 0.6) < 0.03

    def code_share(convs):  # among the turns the generator makes, how many ask for code
        made = [c for c in convs if c != MODEL_QUERY]
        return sum(c.startswith("Write a ") and " function that " in c for c in made) / len(made)

    assert abs(code_share(more) - code_share(default)) < 0.03 and code_share(default) > 0.05


def test_the_users_turn_is_opened_as_the_chat_template_lays_out_a_conversation(bundled_fp32):
    from types import SimpleNamespace

    from specula.engine.api.prompts import Message, encode
    from specula.engine.heads.train import query_prefix

    tok = bundled_fp32.tokenizer
    prefix = query_prefix(tok)
    whole = encode(tok, (Message("user", "What is the capital of France?"),), True)
    assert whole[: len(prefix)] == prefix and len(whole) > len(prefix) + 5
    text = tok.decode(prefix)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>user\n")  # its default system prompt
    assert query_prefix(SimpleNamespace(chat_template=None)) is None


def test_a_question_the_model_wrote_is_kept_only_when_finished_plain_and_new():
    from specula.engine.heads.train import usable_query

    asked = {"What is the tallest mountain in Europe?"}
    assert usable_query("Can you recommend some outdoor activities for a rainy weekend?", True, asked)
    assert usable_query("Plan a surprise party for my aunt.\nShe likes jazz.", True, asked)
    assert not usable_query("Can you recommend some outdoor activities for a", False, asked)  # cut at the limit
    assert not usable_query("Hello there", True, asked)  # too short to be a task
    assert not usable_query("What is the tallest mountain in Europe?", True, asked)  # asked before
    assert not usable_query("Además de Pumabb - Artsã£as y el Profesional de tetaensamientos, ñ ñ ñ ñ", True, asked)
    assert not usable_query("word " * 121, True, asked)


def test_without_a_chat_template_the_questions_left_to_the_model_are_dropped():
    from types import SimpleNamespace

    from specula.engine.api.prompts import Message
    from specula.engine.heads.train import MODEL_QUERY
    from specula.engine.heads.train.distill import write_queries

    target = SimpleNamespace(tokenizer=SimpleNamespace(chat_template=None), context_window=128, eos_ids=frozenset())
    fresh = [((Message("user", MODEL_QUERY),), 0), ((Message("user", "Explain rainbows."),), 1)]
    written = set()
    assert write_queries(target, None, fresh, 0, set(), written, lambda: False) == fresh[1:] and not written


@pytest.mark.usefixtures("one_torch_thread")
def test_the_model_writes_first_turns_that_it_then_answers(bundled_fp32, monkeypatch, tmp_path):
    """With every first turn left to the model: it writes each question (sampled from its chat template
    opened at the user's turn), the same for a seed, all different, and answers them; no placeholder is
    ever answered."""
    from specula.engine.heads import train
    from specula.engine.heads.train import distill, prompts

    monkeypatch.setattr(prompts, "DOCUMENT_SHARE", 0.0)
    monkeypatch.setattr(prompts, "MODEL_QUERY_SHARE", 1.0)
    monkeypatch.setattr(distill, "FOLLOW_UP_SHARE", 0.0)
    tok = bundled_fp32.tokenizer

    def questions(seed, store=None):
        made = train.self_distill(bundled_fp32, 8, max_new=4, batch=3, seed=seed, sampled=0.0, store=store)
        users = [tok.decode(a.prompt).split("<|im_start|>user\n")[1].split("<|im_end|>")[0] for a in made]
        return made, users

    made, users = questions(5, tmp_path / "answers.jsonl")
    assert len(made) >= 2 and all(len(a.answer) == 4 and a.written for a in made)
    assert [a.written for a in train.read_answers(tmp_path / "answers.jsonl")] == [True] * len(made)  # stored so
    assert all(train.usable_query(u, True, set()) for u in users) and len(set(users)) == len(users)
    assert all("\x00" not in u and train.MODEL_QUERY not in u for u in users)
    assert questions(5)[1] == users


def test_continuations_through_generate_are_greedy_or_drawn_with_the_settings_given():
    """Where the engine's batched decoding does not run (a GPU), prompts of several lengths are continued in one
    padded generate() batch: greedily as the model's own continuation alone, or sampled with the settings
    given (the questions' temperature 1.0), the same for a seed."""
    from types import SimpleNamespace

    from specula.engine.heads.train import QUERY_SAMPLING
    from specula.engine.heads.train.distill import continuations

    model = tiny_model(vocab=64, layers=2, seed=3)
    target = SimpleNamespace(model=model, tokenizer=SimpleNamespace(pad_token_id=None), eos_ids=frozenset({0}),
                             device=torch.device("cpu"))
    prompts = [[5, 9, 11], [7, 3, 12, 40, 41, 2, 8], [33]]
    greedy = continuations(target, None, prompts, 6, False, 0, lambda: False)
    for prompt, row in zip(prompts, greedy):
        alone = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=[0])
        assert row[: alone.shape[1] - len(prompt)] == alone[0, len(prompt):].tolist()
    drawn = continuations(target, None, prompts, 6, True, 9, lambda: False, QUERY_SAMPLING, keep=False)
    assert drawn == continuations(target, None, prompts, 6, True, 9, lambda: False, QUERY_SAMPLING, keep=False)
    assert drawn != greedy and all(len(r) == 6 for r in drawn)


def test_the_held_out_tenth_of_a_data_folder_gives_its_first_turns_by_kind(tmp_path):
    import json

    from specula.engine.api.errors import SpeculaError
    from specula.engine.heads.train import held_out_first_turns

    rows = [{"prompt": [i, i + 1], "answer": [7] * 5, "index": -1 if i % 4 == 3 else i,
             **({"written": True} if i % 3 == 0 else {})} for i in range(40)]
    (tmp_path / "answers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert held_out_first_turns(tmp_path) == [("written by the model", [0, 1]), ("generated", [1, 2]), ("generated", [2, 3])]
    with pytest.raises(SpeculaError, match="no training answers"):
        held_out_first_turns(tmp_path / "missing")


def test_a_data_folder_made_with_another_share_of_model_questions_is_refused_on_resume(tiny_target, tmp_path):
    from specula.engine.api.errors import SpeculaError, TrainingCancelled
    from specula.engine.heads.train import TrainOptions, run_training

    data = tmp_path / "data"
    data.mkdir()  # a folder the user named stays when a run that kept nothing is cancelled
    written = []  # what a run with its own share writes as the folder's settings, read when it is told to stop

    def stop():
        written.append((data / "about.json").read_text())
        return True

    with pytest.raises(TrainingCancelled):
        run_training(tiny_target, TrainOptions(tokens=1000, out=tmp_path / "a", data=data, written=0.6), should_stop=stop)
    assert '"model_questions": 0.6' in written[0]
    (data / "about.json").write_text(written[0])  # as a run that kept answers leaves it
    with pytest.raises(SpeculaError, match="other settings"):  # the default share would mix other prompts in
        run_training(tiny_target, TrainOptions(tokens=1000, out=tmp_path / "b", data=data), should_stop=lambda: True)
    with pytest.raises(TrainingCancelled):  # the same share resumes (and stops here when told to)
        run_training(tiny_target, TrainOptions(tokens=1000, out=tmp_path / "c", data=data, written=0.6),
                     should_stop=lambda: True)


def test_a_torn_last_answer_is_dropped_before_more_are_appended(tmp_path):
    """A run killed while writing an answer leaves a line without its end; the next run's first answer must
    not join it (both would be lost)."""
    import json

    from specula.engine.heads.train import answers

    store = tmp_path / "answers.jsonl"
    whole = json.dumps({"prompt": [1, 2], "answer": [3, 4], "index": 0})
    store.write_text(whole + "\n" + whole[:17], encoding="utf-8")
    answers.drop_torn_tail(store)
    with store.open("a", encoding="utf-8") as sink:
        sink.write(json.dumps({"prompt": [5], "answer": [6], "index": 1}) + "\n")
    assert [a.answer for a in answers.read_answers(store)] == [[3, 4], [6]]
    answers.drop_torn_tail(store)  # whole lines: left as they are
    assert len(answers.read_answers(store)) == 2
    with store.open("a", encoding="utf-8") as sink:
        sink.write("[" * 50000 + "]" * 50000 + "\n")  # deeper than Python's JSON reader goes: skipped as well
    assert len(answers.read_answers(store)) == 2
