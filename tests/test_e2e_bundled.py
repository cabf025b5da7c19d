"""End to end on the bundled SmolLM2-135M-Instruct (fp32, CPU): every strategy says what `none` says,
through the compiled decoding step where this machine can build it (as a user's answers run)."""

import copy
from dataclasses import replace

import pytest
import torch

from specula.engine.api.events import Finished
from specula.engine.api.prompts import conversation
from specula.engine.api.types import DecodeConfig, GenerateRequest, SamplingParams
from specula.engine.cpu import step as compiled
from specula.engine.drafters import DRAFTERS
from specula.engine.serving.session import Session

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Rewrite this sentence in the past tense: The cat sits on the mat and watches the birds.",
    "Fix the bug and return the whole function:\n```python\ndef add(a, b):\n    return a - b\n```",
]


@pytest.fixture(scope="module")
def session(bundled_fp32):
    compiled.prepare(wait=True)  # eager, with the reason logged, where it cannot be built
    target = replace(bundled_fp32, step="compiled")
    draft = replace(target, model=copy.deepcopy(bundled_fp32.model).to(torch.bfloat16), dtype=torch.bfloat16)
    s = Session()
    s.use(target, draft)
    return s


def test_the_shipped_heads_are_found_for_the_fp32_model(session):
    # the heads were trained on the bf16 weights; the same weights in fp32 are the same model
    assert set(session.heads) == {"eagle", "medusa"} and session.describe().warnings == ()
    assert all("bundled" in str(folders[0]) for folders in session.heads.values())


def answer(session, prompt, strategy, options=(), **config):
    request = GenerateRequest(conversation(prompt), strategy, DecodeConfig(max_new_tokens=48, **config), chat=True,
                              options=options)
    return [e for e in session.generate(request) if isinstance(e, Finished)][0]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_every_strategy_gives_the_plain_greedy_answer(session, prompt):
    base = answer(session, prompt, "none")
    assert base.totals.new_tokens > 5
    if compiled.ops() is not None:
        runner = session.target.new_runner()
        runner.forward(torch.tensor([1, 2]))
        runner.forward(torch.tensor([3]))
        assert runner.compiled  # the answers here run through the compiled step
    for strategy in DRAFTERS:
        for adaptive in (False, True):
            got = answer(session, prompt, strategy, k=5, adaptive_k=adaptive)
            assert got.token_ids == base.token_ids, (strategy, adaptive)
            assert got.text == base.text
    got = answer(session, prompt, "eagle", options=(("tree", 1),), k=6)  # an EAGLE-2 dynamic tree
    assert got.token_ids == base.token_ids


def test_draft_model_and_prompt_lookup_really_speculate(session):
    got = answer(session, PROMPTS[2], "prompt-lookup", k=5)
    assert got.totals.accepted > 0
    # the grow/shrink rule drafts at every step, and the draft model its whole length (not only what it is
    # confident of): the session's draft-model drafter has learned in the answers before that its drafts (the
    # target's own size) do not pay on this CPU, and would take plain steps
    got = answer(session, PROMPTS[0], "draft-model", options=(("confident", 0),), k=5, adaptive_k=True)
    assert got.totals.acceptance_rate > 0.5  # a bf16 copy of the target agrees with it almost always


def test_temperature_one_with_a_seed_repeats(session):
    params = SamplingParams(temperature=1.0)
    a = answer(session, PROMPTS[0], "prompt-lookup", params=params, seed=42)
    b = answer(session, PROMPTS[0], "prompt-lookup", params=params, seed=42)
    assert a.token_ids == b.token_ids and a.text == b.text


def test_a_prepared_load_has_made_the_drafter_and_its_answers_are_unchanged(session, monkeypatch):
    """`LoadRequest.prepare`: the strategy's drafter made and a short answer run before the model is ready (and
    the thread count a busy moment asks for checked); the plain steps it timed are not the live speedup's, and
    the answers after it are those of a session that was not prepared."""
    import specula.engine.serving.session as session_module

    checked = []

    class Governor:
        def check_ahead(self, runner):
            checked.append(runner.length)

        def begin(self):
            pass

        def tick(self, runner=None):
            return torch.get_num_threads()

    monkeypatch.setattr(session_module, "governor", Governor)
    fresh = Session()
    fresh.use(session.target)
    fresh.prepare(GenerateRequest((), "prompt-lookup", DecodeConfig(max_new_tokens=48, k=5), chat=True))
    assert any(key[0] == "prompt-lookup" for key in fresh._drafters) and checked and checked[0] > 0
    assert not fresh.plain._items
    for prompt in PROMPTS[:2]:
        assert answer(fresh, prompt, "prompt-lookup", k=5).token_ids == answer(session, prompt, "none").token_ids


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(session, monkeypatch):
    """Megabytes of prompt: refused from its length in characters (no token is longer than the vocabulary's
    longest entry), never tokenized (3-4 s and 0.66 GB for 3.6 MB); a prompt that may fit is tokenized as ever."""
    from specula.engine.api import prompts
    from specula.engine.api.errors import ContextTooLongError

    tokenized = []
    real = prompts.encode
    monkeypatch.setattr(prompts, "encode", lambda *args: tokenized.append(1) or real(*args))
    huge = GenerateRequest(conversation("x" * 3_600_000), "none", DecodeConfig(max_new_tokens=4), chat=True)
    with pytest.raises(ContextTooLongError, match="at least .* tokens .*3,600,000 characters"):
        list(session.generate(huge))
    assert tokenized == []
    text = "The quick brown fox jumps over the lazy dog. " * 40
    floor = prompts.fewest_tokens(session.target.tokenizer, conversation(text))
    assert 0 < floor <= len(real(session.target.tokenizer, conversation(text), True))  # a floor, never above
    assert answer(session, text, "none").totals.new_tokens > 0 and tokenized
