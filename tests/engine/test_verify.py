"""The acceptance rule itself, on distributions given directly."""

import pytest
import torch

from specula.engine.api.types import SamplingParams
from specula.engine.decoding.verify import verify_greedy, verify_sampling, verify_sampling_at_once

RULES = [verify_sampling, verify_sampling_at_once]


def one_hot_logits(ids, vocab=6):
    logits = torch.full((len(ids), vocab), -10.0)
    logits[torch.arange(len(ids)), torch.tensor(ids)] = 10.0
    return logits


def test_greedy_accepts_the_agreeing_prefix_and_corrects():
    logits = one_hot_logits([1, 2, 3, 4])  # target wants 1, 2, 3 then 4
    v = verify_greedy(logits, torch.tensor([1, 2, 5]))
    assert (v.accepted, v.next_token) == (2, 3)


def test_greedy_all_accepted_gives_a_bonus():
    v = verify_greedy(one_hot_logits([1, 2, 3, 4]), torch.tensor([1, 2, 3]))
    assert (v.accepted, v.next_token) == (3, 4)


def test_greedy_first_token_wrong():
    v = verify_greedy(one_hot_logits([1, 2]), torch.tensor([0]))
    assert (v.accepted, v.next_token) == (0, 1)


def test_greedy_without_draft_is_plain_decoding():
    v = verify_greedy(one_hot_logits([5]), torch.empty(0, dtype=torch.long))
    assert (v.accepted, v.next_token) == (0, 5)


def _first_token_distribution(p_logits, q, n, seed, one_hot_draft=None, rule=verify_sampling):
    """Empirical distribution of the first emitted token under the rule, with drafts drawn from q."""
    gen = torch.Generator().manual_seed(seed)
    vocab = p_logits.shape[-1]
    counts = torch.zeros(vocab)
    params = SamplingParams(temperature=1.0)
    for _ in range(n):
        if one_hot_draft is None:
            d = torch.multinomial(q[0], 1, generator=gen)
            v = rule(p_logits, d, q, params, gen)
        else:
            d = torch.tensor([one_hot_draft])
            v = rule(p_logits, d, None, params, gen)
        first = int(d[0]) if v.accepted >= 1 else v.next_token
        counts[first] += 1
    return counts / n


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("case", range(3))
def test_sampling_rule_reproduces_the_target_distribution(case, rule):
    torch.manual_seed(case)
    vocab = 5
    p_logits = torch.randn(2, vocab) * 1.5
    q = torch.randn(1, vocab).mul(1.5).softmax(-1)
    p = p_logits[0].softmax(-1)
    got = _first_token_distribution(p_logits, q, 20000, seed=case, rule=rule)
    assert (got - p).abs().sum() / 2 < 0.02  # total variation
    # the draft's own distribution is measurably different, so the test can tell them apart
    assert (q[0] - p).abs().sum() / 2 > 0.05


@pytest.mark.parametrize("rule", RULES)
def test_sampling_rule_with_a_point_guess(rule):
    torch.manual_seed(7)
    p_logits = torch.randn(2, 4)
    p = p_logits[0].softmax(-1)
    got = _first_token_distribution(p_logits, None, 20000, seed=1, one_hot_draft=2, rule=rule)
    assert (got - p).abs().sum() / 2 < 0.02


def test_greedy_verification_gives_probabilities_only_when_asked():
    import torch

    from specula.engine.decoding.verify import verify_greedy

    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0]])
    draft = torch.tensor([0, 2])
    plain = verify_greedy(logits, draft)
    assert (plain.accepted, plain.next_token, plain.p_of_draft) == (1, 1, ())
    asked = verify_greedy(logits, draft, q=torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]), probs=True)
    assert (asked.accepted, asked.next_token) == (1, 1)  # the same verdict
    expected = torch.softmax(logits[:2], -1)[[0, 1], [0, 2]].tolist()
    assert asked.p_of_draft == pytest.approx(expected) and asked.q_of_draft == pytest.approx((0.5, 0.8))


def test_sampling_at_once_gives_what_the_rule_gives_when_the_outcome_is_forced():
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    logits = one_hot_logits([1, 2, 3, 4], vocab=6) * 3  # near one-hot: the target wants 1, 2, 3, then 4
    for draft, expect in (([1, 2, 3], (3, 4)), ([1, 2, 5], (2, 3)), ([0], (0, 1))):
        v = verify_sampling_at_once(logits[: len(draft) + 1], torch.tensor(draft), None, params, gen)
        w = verify_sampling(logits[: len(draft) + 1], torch.tensor(draft), None, params, gen)
        assert (v.accepted, v.next_token) == (w.accepted, w.next_token) == expect
        assert len(v.p_of_draft) == len(v.q_of_draft) == len(draft) and v.q_of_draft == (1.0,) * len(draft)
