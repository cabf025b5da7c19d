import pytest
import torch

from specula.engine.api.errors import SpeculaError
from specula.engine.api.types import SamplingParams
from specula.engine.decoding.sampling import choose, process_logits


def test_greedy_is_one_hot_on_the_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 2.9]])
    probs = process_logits(logits, SamplingParams(temperature=0))
    assert torch.equal(probs, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    assert choose(logits, SamplingParams(), None).tolist() == [1, 0]


def test_temperature_one_is_softmax():
    logits = torch.randn(5, 11)
    probs = process_logits(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(probs, logits.softmax(-1))


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    probs = process_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, True, False, False]
    assert torch.allclose(probs.sum(), torch.tensor(1.0))


def test_top_p_keeps_the_smallest_set_covering_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    kept = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.8)) > 0
    assert kept.tolist() == [True, True, False, False]
    kept = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.81)) > 0
    assert kept.tolist() == [True, True, True, False]
    # the most likely token always survives
    kept = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.1)) > 0
    assert kept.tolist() == [True, False, False, False]


def test_seeded_draws_repeat():
    probs = torch.full((50,), 1 / 50)
    from specula.engine.decoding.sampling import sample

    a = [int(sample(probs, torch.Generator().manual_seed(3))) for _ in range(3)]
    b = [int(sample(probs, torch.Generator().manual_seed(3))) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize(
    "kwargs", [dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)]
)
def test_bad_parameters_are_refused(kwargs):
    with pytest.raises(SpeculaError):
        SamplingParams(**kwargs)
