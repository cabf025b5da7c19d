"""The training prompts and answers for draft heads (engine/heads/documents.py, heads/train.py): long texts
from what ships on the machine (Python's documentation, package READMEs, licences, manual pages), pasted
with a task; answers greedy and sampled, the same for a seed."""

import random

import pytest
import torch

from specula.engine.api.types import ModelSpec, SamplingParams
from specula.engine.decoding.sampling import process_logits
from specula.engine.heads import documents
from specula.engine.heads.documents import MAX_CHARS, MIN_CHARS, Document, document_prompt
from specula.engine.heads.train import (
    DOCUMENT_SHARE,
    _BatchAnswers,
    _EngineAnswers,
    prompt_conversations,
    self_distill,
    top_p_prefix,
)
from specula.engine.models.loading import load_model
from tests.support.tiny import native, tiny_model

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
    return load_model(ModelSpec(str(tiny_folder), "cpu", "fp32"))


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
    unended = _EngineAnswers(target, None).answer(prompts, 24, False, 11, lambda: False)
    eos = unended[0][6]  # a token the first greedy answer holds midway ends answers from now on
    target.eos_ids = frozenset({eos})
    batched = _BatchAnswers(target, None, rows=3)
    made = batched.answer(prompts, 24, sampling, seed=11, should_stop=lambda: False)
    assert len(made) == len(prompts) and all(1 <= len(a) <= 24 for a in made)
    if not sampling:
        assert any(a[-1] == eos for a in made) and any(len(a) == 24 for a in made)  # both ways of ending
    assert all(r.compiled for r in batched.runners) and len(batched.runners) == 3
    if sampling:
        assert made == _BatchAnswers(target, None, rows=2).answer(prompts, 24, True, 11, lambda: False)
        assert made != batched.answer(prompts, 24, True, 12, lambda: False)
    else:
        cut = [a[:-1] if a[-1] == eos else a for a in made]  # one at a time, an answer leaves out its end token
        assert cut == _EngineAnswers(target, None).answer(prompts, 24, False, 11, lambda: False)
