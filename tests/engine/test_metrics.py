import pytest

from engine.events import Origin, Step, Token
from engine.metrics import BaselineCost, LiveMetrics, measure_baseline


def step(i, drafted, accepted, n_tokens, elapsed, context=10):
    tokens = tuple(Token(1, "x", Origin.DRAFT, i) for _ in range(n_tokens))
    return Step(0, i, drafted, accepted, tokens, (), 0.0, 0.0, context, drafted, elapsed)


def test_baseline_expected_is_the_sum_of_per_token_costs():
    cost = BaselineCost(a=0.02, b=1e-5)
    assert cost.expected(100, 5) == pytest.approx(sum(cost.per_token(100 + i) for i in range(5)))


def test_live_metrics_definitions():
    m = LiveMetrics(BaselineCost(a=0.1, b=0.0))
    m.add(step(0, 0, 0, 1, elapsed=0.5))  # prefill
    m.add(step(1, 4, 4, 5, elapsed=0.7))  # all accepted + bonus
    m.add(step(2, 4, 1, 2, elapsed=0.9))  # one accepted + correction
    assert m.new_tokens == 8 and m.forwards == 3
    assert m.acceptance_rate == pytest.approx(5 / 8)
    assert m.mean_accepted_length == pytest.approx(8 / 3)
    assert m.per_position == [1.0, 0.5, 0.5, 0.5]
    assert m.accepted_lengths == [4, 1]
    # plain decoding would need 7 decode steps of 0.1 s; speculation took 0.4 s after the prefill
    assert m.speedup == pytest.approx(0.7 / 0.4)
    assert m.tokens_per_s == pytest.approx(7 / 0.4)  # after the first token


def test_measured_baseline_grows_with_context():
    from .tiny import loaded, tiny_model

    runner = loaded(tiny_model(vocab=64)).new_runner()
    cost = measure_baseline(runner, lengths=(8, 256), repeats=2)
    assert cost.a > 0 and cost.b >= 0
    assert runner.length == 0
