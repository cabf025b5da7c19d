import pytest

from specula.engine.api.events import BaselineCost, Origin, Step, Token
from specula.engine.api.metrics import LiveMetrics
from specula.engine.decoding.speedup import measure_baseline


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
    from tests.support.tiny import loaded, tiny_model

    runner = loaded(tiny_model(vocab=64)).new_runner()
    cost = measure_baseline(runner, lengths=(8, 256), repeats=2)
    assert cost.a > 0 and cost.b >= 0
    assert runner.length == 0


# -- the live speedup (SpeedupMeter) ------------------------------------------------------------------
def feed(meter, steps):
    """steps: (tokens, seconds, plain) where plain marks a step that drafted nothing."""
    for tokens, seconds, plain in steps:
        meter.add(tokens, seconds, seconds if plain else None)


def probe(seconds):
    """A probe as the decoder makes it: SETTLE plain steps, then the sample (here all of one cost)."""
    from specula.engine.decoding.speedup import SETTLE

    return [(1, seconds, True)] * (SETTLE + 1)


def test_plain_decoding_measures_a_speedup_of_exactly_one():
    from specula.engine.decoding.speedup import SpeedupMeter

    m = SpeedupMeter()
    feed(m, [(1, 0.010 + 0.001 * (i % 3), True) for i in range(50)])
    assert m.value == pytest.approx(1.0)


def test_speedup_is_plain_time_for_the_tokens_over_the_time_spent():
    from specula.engine.decoding.speedup import SpeedupMeter

    m = SpeedupMeter()
    # plain steps cost 10 ms; a speculative step 15 ms for 3 tokens: 30 ms of plain decoding
    feed(m, probe(0.010) + [(3, 0.015, False)] * 20 + probe(0.010) + [(3, 0.015, False)] * 20)
    n = len(probe(0.010))
    expected = (2 * n * 0.010 + 40 * 3 * 0.010) / (2 * n * 0.010 + 40 * 0.015)
    assert m.value == pytest.approx(expected)
    assert m.plain_step_s == pytest.approx(0.010)


def test_a_machine_that_slows_down_mid_answer_slows_both_sides_of_the_ratio():
    """Another program takes half the machine after 60 steps: every step, plain or speculative, takes
    twice as long from then on. The true speedup is unchanged, and the meter still says it."""
    from specula.engine.decoding.speedup import MIN_PLAIN, NOISY_GAP, PROBE_EVERY, RUN_SAMPLES, SETTLE, SpeedupMeter

    m, truth, n = SpeedupMeter(), 3 * 0.010 / 0.016, 480
    for i in range(n):
        slow = 2.0 if i >= 60 else 1.0
        if m.probe_due():
            m.add(1, 0.010 * slow, 0.010 * slow)
        else:
            m.add(3, 0.016 * slow)
    # a run at the start, then one every PROBE_EVERY, or NOISY_GAP once the samples scatter (the slowdown)
    assert len(m.samples) >= MIN_PLAIN + RUN_SAMPLES * (n // (PROBE_EVERY + SETTLE + RUN_SAMPLES) - 1)
    assert n - m.speculative <= SETTLE + MIN_PLAIN + (SETTLE + RUN_SAMPLES) * (n // NOISY_GAP + 1)
    # with the plain steps' own lower yield counted in, within 5% of the speculative steps' own ratio
    assert m.value == pytest.approx(truth, rel=0.05)
    # a load-time figure (the old way) would have said the speculative steps after the slowdown were slow
    assert (n * 3 * 0.010) / m.spent_s < 0.75 * truth


def test_verify_passes_that_run_slower_than_theirs_after_the_samples_call_plain_steps_at_once():
    """Passes of 3, 4 and 5 rows scattering by 15% (a quiet machine) call nothing; three in a row at 1.6x their row
    count's first pass since the samples (another program) call plain steps at once, unless the answer is seeded
    (its plain steps come on fixed gaps); a new sample starts the references again."""
    from specula.engine.decoding.speedup import MIN_PLAIN, SETTLE, SpeedupMeter

    m = SpeedupMeter()
    for _ in range(MIN_PLAIN):
        feed(m, probe(0.010))
    jitter = (1.0, 1.15, 0.9, 1.1, 0.87, 1.12)
    for i in range(30):
        rows = 3 + i % 3
        m.add(3, 0.016, rows=rows, pass_s=(0.010 + 0.002 * rows) * jitter[i % 6])
        assert not m.probe_due() and not m.shifted, i
    for i in range(3):
        rows = 3 + i % 3
        m.add(3, 0.026, rows=rows, pass_s=1.6 * (0.010 + 0.002 * rows))
    assert m.shifted and m.probe_due() and not m.probe_due(own_only=True)
    feed(m, [(1, 0.016, True)] * (SETTLE + 1))  # the run: settling steps, then a sample at the new speed
    assert not m.shifted and m.samples[-1] == pytest.approx(0.016)
    m.add(3, 0.026, rows=4, pass_s=0.029)  # the new speed is the new reference
    m.add(3, 0.026, rows=4, pass_s=0.029)
    assert not m.shifted


def test_the_uncertainty_shrinks_with_more_plain_samples_and_is_shown_while_large():
    from specula.engine.api.metrics import speedup_text
    from specula.engine.decoding.speedup import SpeedupMeter

    m = SpeedupMeter()
    feed(m, probe(0.010) + [(3, 0.015, False)])
    assert m.error is None and speedup_text(m.value, m.error).startswith("~")  # one sample: a guess
    feed(m, probe(0.014) + [(3, 0.015, False)] + probe(0.007))
    wide = m.error
    assert wide is not None and "±" in speedup_text(m.value, wide)
    feed(m, [(1, 0.010 + 0.0005 * (i % 2), True) for i in range(60)])
    assert m.error < wide / 3 and "±" not in speedup_text(m.value, m.error)
    assert speedup_text(None, None) == "–"


def test_the_relative_error_is_the_samples_standard_error_however_long_the_answer():
    """Kept as running sums (it is read every step): the standard error of the pool's mean over the mean,
    with the seeds while the answer has few samples of its own, then over its own samples only."""
    import math
    import random
    import statistics

    from specula.engine.decoding.speedup import MIN_PLAIN, SETTLE, SpeedupMeter

    def definition(pool):
        return statistics.stdev(pool) / (statistics.fmean(pool) * math.sqrt(len(pool)))

    rng = random.Random(3)
    m = SpeedupMeter(seeds=[0.0040, 0.0052])
    assert m.relative_error == pytest.approx(definition([0.0040, 0.0052]), rel=1e-9)
    own = []
    for i in range(2000):
        if i % 3 == 0:
            assert not m.add(4, 0.006)  # speculative steps add no sample, nor the plain steps settling after
            assert not any(m.add(1, 0.020, 0.020) for _ in range(SETTLE))
        own.append(0.004 + 0.002 * rng.random() + (0.01 if i % 97 == 0 else 0.0))  # now and then a slow one
        assert m.add(1, own[-1], own[-1])
        pool = own if len(own) >= MIN_PLAIN else [0.0040, 0.0052, *own]
        if i < 5 or i % 199 == 0:
            assert m.relative_error == pytest.approx(definition(pool), rel=1e-9)


def test_a_new_answer_starts_from_recent_plain_samples_instead_of_probing_at_once():
    from specula.engine.decoding.speedup import MIN_PLAIN, PlainHistory, SpeedupMeter

    history = PlainHistory()
    for _ in range(MIN_PLAIN):
        history.add(0.010)
    m = SpeedupMeter(history.seeds())
    assert not m.probe_due()  # enough recent samples: no early probes
    m.add(3, 0.015)
    assert m.value == pytest.approx(3 * 0.010 / 0.015)
    fresh = SpeedupMeter()
    assert not fresh.probe_due()  # none: the step after the prompt drafts, then a run until it has its own
    fresh.add(3, 0.015)
    fresh.add(3, 0.015)
    assert fresh.probe_due()


def test_a_short_answer_long_after_the_last_is_costed_from_older_samples_as_an_estimate(monkeypatch):
    """No plain step of its own and no recent samples (a few draft-model steps a minute after the last
    answer): the older samples give an estimate, shown "~", instead of no figure; its own first sample
    then replaces them."""
    from specula.engine.api.metrics import speedup_text
    from specula.engine.decoding import speedup
    from specula.engine.decoding.speedup import MIN_PLAIN, RECENT_S, PlainHistory, SpeedupMeter

    clock = [1000.0]
    monkeypatch.setattr(speedup.time, "monotonic", lambda: clock[0])
    history = PlainHistory()
    for x in (0.010, 0.012, 0.011, 0.009):
        history.add(x)
    clock[0] += RECENT_S + 30
    assert history.seeds() == [] and history.latest() == [0.012, 0.011, 0.009]
    m = SpeedupMeter(history.seeds(), history.latest())
    assert not m.probe_due()  # it still measures its own as early as without them
    m.add(3, 0.015)
    m.add(3, 0.015)
    assert m.probe_due()
    assert m.value == pytest.approx(6 * 0.009 / 0.030) and m.error is None
    assert speedup_text(m.value, m.error) == "~1.80×"
    assert SpeedupMeter().value is None  # nothing at all: no figure
    feed(m, probe(0.010))  # its own sample: the open stretch (and the steps settling) costed from it alone
    n = len(probe(0.010))
    assert m.value == pytest.approx((6 + n) * 0.010 / (0.030 + n * 0.010)) and len(m.pool) == 1 < MIN_PLAIN


def test_live_metrics_show_the_engines_speedup_when_the_steps_carry_it():
    m = LiveMetrics(BaselineCost(a=0.1, b=0.0))  # a load-time figure that would say otherwise
    m.add(step(0, 0, 0, 1, elapsed=0.5))
    s = Step(0, 1, 4, 4, (), (), 0.0, 0.0, 10, 4, 0.7, speedup=1.9, speedup_err=0.2, plain_step_s=0.02)
    m.add(s)
    assert (m.speedup, m.speedup_err, m.plain_rate(10)) == (1.9, 0.2, pytest.approx(50.0))


def test_a_cold_first_step_counts_for_itself_only():
    from specula.engine.decoding.speedup import SpeedupMeter

    m = SpeedupMeter()
    m.add(1, 0.050, 0.050, sample=False)  # plain, but cold: five times the others
    feed(m, [(1, 0.010, True)] * 20)
    assert m.value == pytest.approx(1.0) and m.plain_step_s == pytest.approx(0.010)


# -- the draft length of each step (DraftLength) --------------------------------------------------------
def train_lengths(lengths, steps, keep_rate, cost, plain_s=0.010):
    """Drafts of the full k whose positions are each kept with probability keep_rate (deterministically
    spread), a step of n drafted tokens taking cost(n) seconds while a plain step takes plain_s."""
    import random

    rng = random.Random(1)
    for _ in range(steps):
        accepted = 0
        while accepted < lengths.k and rng.random() < keep_rate:
            accepted += 1
        lengths.observe(lengths.k, accepted, cost(lengths.k), plain_s)
        lengths.observe(1, int(rng.random() < keep_rate), cost(1), plain_s)


def test_drafts_that_are_seldom_kept_and_cost_rows_give_way_to_plain_steps():
    from specula.engine.decoding.length import DraftLength

    lengths = DraftLength(8)
    train_lengths(lengths, 20, keep_rate=0.15, cost=lambda n: 0.010 * (1 + 0.25 * n))  # 8 rows: 3 plain steps
    choices = [lengths.choose(plain_s=0.010) for _ in range(40)]
    assert choices.count(0) >= 30  # plain steps: nothing drafted pays
    assert 1 in choices  # one drafted token is still tried now and then


def test_drafts_that_are_kept_and_rows_that_are_cheap_draft_long():
    from specula.engine.decoding.length import DraftLength

    lengths = DraftLength(8)
    train_lengths(lengths, 20, keep_rate=0.9, cost=lambda n: 0.010 * (1 + 0.02 * n))  # a GPU-like flat cost
    assert [lengths.choose(plain_s=0.010) for _ in range(16)].count(8) >= 14


def test_what_was_learned_in_one_context_holds_in_another_of_other_step_costs():
    """Costs are kept in plain steps: after an answer over a long context (every step 3x dearer), a short
    one still drafts where drafting pays, and a plain step there is not taken for a third of a draft's."""
    from specula.engine.decoding.length import DraftLength

    lengths = DraftLength(8)
    train_lengths(lengths, 20, keep_rate=0.8, cost=lambda n: 0.030 * (1 + 0.25 * n), plain_s=0.030)
    long_context = lengths.best(plain_s=0.030)
    short_context = lengths.best(plain_s=0.010)
    assert short_context[0] == long_context[0] >= 3
    assert short_context[1] == pytest.approx(3 * long_context[1])  # tokens per second: steps 3x cheaper
    assert short_context[1] > 1 / 0.010  # and more than plain decoding's


def test_the_best_length_is_worked_out_again_after_each_measurement_and_only_then():
    """auto asks each choice's best length every step: it is kept between measurements (the plain-step cost
    now only scales its rate) and follows every new one."""
    import copy

    from specula.engine.decoding.length import DraftLength

    lengths = DraftLength(8)
    train_lengths(lengths, 12, keep_rate=0.8, cost=lambda n: 0.010 * (1 + 0.05 * n))
    first = lengths.best(plain_s=0.010)
    assert lengths.best(plain_s=0.020) == (first[0], pytest.approx(first[1] / 2))
    fresh = copy.deepcopy(lengths)
    fresh._best.clear()
    assert fresh.best(plain_s=0.010, least=1) == lengths.best(plain_s=0.010, least=1)
    for _ in range(30):  # nothing past the first token is kept any more: shorter drafts
        lengths.observe(8, 0, 0.010 * 1.4, 0.010)
    assert lengths.best(plain_s=0.010)[0] < first[0]


def test_a_step_is_booked_only_once_a_plain_step_was_measured():
    from specula.engine.decoding.length import DraftLength

    lengths = DraftLength(4)
    lengths.observe(4, 4, 0.050, None)  # no plain-step cost yet: its time means nothing here
    assert lengths.cost == {} and lengths.reached[3] == 1 and lengths.drafting_steps == 1
    lengths.observe(4, 4, 0.050, 0.025)
    assert lengths.cost == {4: pytest.approx(2.0)}


def test_the_choice_waits_for_measurements():
    from specula.engine.decoding.length import DraftLength

    lengths = DraftLength(6)
    assert lengths.choose(plain_s=0.010) == 6  # nothing measured yet: the strategy's own length


def test_an_answer_takes_earlier_samples_of_its_own_kind_of_step_only():
    """The first answers after a start may run on the eager step while the compiled one is built: their plain
    samples never stand for a compiled answer's plain decoding (it measures its own)."""
    from specula.engine.decoding.speedup import MIN_PLAIN, PlainHistory, SpeedupMeter

    history = PlainHistory()
    for _ in range(MIN_PLAIN):
        history.add(0.030, "eager")
    assert history.seeds("compiled") == [] and history.latest("compiled") == []
    m = SpeedupMeter(history.seeds("compiled"), history.latest("compiled"))
    m.add(3, 0.015)
    m.add(3, 0.015)
    assert m.value is None and m.probe_due()
    assert history.seeds("eager") == [0.030] * MIN_PLAIN


def test_summed_totals_add_counts_join_lengths_and_merge_positions():
    from specula.engine.api.events import Totals
    from specula.engine.api.metrics import summed

    a = Totals(new_tokens=10, steps=4, target_forwards=5, drafted=8, accepted=5, wall_s=1.0, prefill_s=0.25,
               draft_s=0.1, verify_s=0.5, accepted_lengths=(2, 0, 3), position_drafted=(3, 3, 2),
               position_accepted=(2, 2, 1))
    b = Totals(new_tokens=3, steps=2, target_forwards=3, drafted=4, accepted=1, wall_s=0.5, prefill_s=0.125,
               draft_s=0.0625, verify_s=0.25, accepted_lengths=(1,), position_drafted=(1, 1, 1, 1),
               position_accepted=(1, 0, 0, 0))
    both = summed([a, b])
    assert (both.new_tokens, both.steps, both.target_forwards, both.drafted, both.accepted) == (13, 6, 8, 12, 6)
    assert (both.wall_s, both.prefill_s, both.draft_s, both.verify_s) == (1.5, 0.375, 0.1625, 0.75)
    assert both.accepted_lengths == (2, 0, 3, 1)
    assert both.position_drafted == (4, 4, 3, 1) and both.position_accepted == (3, 2, 1, 0)
    assert both.mean_accepted_length == 13 / 8 and both.acceptance_rate == 0.5
    assert summed([a]) == a
    empty = summed(())
    assert empty.new_tokens == 0 and empty.target_forwards == 0 and empty.accepted_lengths == ()


def test_a_speedup_too_unsure_to_tell_says_so_instead_of_a_figure(capsys):
    """An answer stopped after a few steps has few plain steps timed: a figure whose standard error is over a
    quarter of it (a cancelled answer at 0% acceptance read "1.88× ±0.93") says it cannot tell, in the terminal
    (and the window's footer: tests/app/test_widgets.py)."""
    from specula.engine.api.events import Finished, Totals
    from specula.engine.api.metrics import speedup_part, speedup_text
    from specula.engine.api.types import GenerateRequest
    from specula.engine.cli.chat import _reply

    assert speedup_text(1.88, 0.93) == "n/a" and speedup_part(1.88, 0.93) == "speedup n/a (too few plain steps timed)"
    assert speedup_text(1.88, 0.30) == "1.88× ±0.30" and speedup_part(1.88, 0.05) == "1.88× vs plain"
    assert speedup_part(None, None) == ""
    totals = Totals(6, 5, 6, 10, 0, 0.5, 0.1, 0.1, 0.3)
    cancelled = Finished(1, "cancelled", "a b c", (1, 2, 3, 4, 5, 6), totals, speedup=1.88, speedup_err=0.93)

    class Backend:
        def generate(self, request, should_stop=None):
            yield cancelled

    assert _reply(Backend(), GenerateRequest((), strategy="auto"), colour=False) is cancelled
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "acceptance 0%" in line and "speedup n/a (too few plain steps timed)" in line and "1.88" not in line
