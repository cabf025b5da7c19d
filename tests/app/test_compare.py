"""Compare with plain decoding, through the real Worker on a tiny random model: the last prompt runs
with `none` and with the current strategy, same seed, back to back; the card shows both rates, their
ratio and whether the token ids are identical; the conversation itself is left as it was."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specula.app.compare import Comparison, RunResult
from specula.engine.api.metrics import speedup_text
from tests.app.conftest import hold_after_step, saved_history, snap, wait_reply


def spy_requests(window) -> list:
    sent = []
    send = window.bridge.send

    def spy(request):
        sent.append(request)
        return send(request)

    window.bridge.send = spy
    return sent


def run_compare(qtbot, window) -> Comparison:
    with qtbot.waitSignal(window.compare.finished, timeout=60_000) as blocker:
        window.compare_action.trigger()
    return blocker.args[0]


def test_compare_runs_plain_then_the_strategy_with_the_same_seed(make_window, qtbot, tmp_path):
    w = make_window(strategy="draft-model", max_new_tokens=40)
    assert not w.compare_action.isEnabled()  # nothing to compare yet
    w.send_text("hello there, tell me a story about a cat")
    wait_reply(qtbot, w)
    turns_before = w.chat.current.turns
    saved_before = saved_history(tmp_path).load_all()[0]
    assert w.compare_action.isEnabled()
    sent = spy_requests(w)
    card = run_compare(qtbot, w)
    # a second pair the other way round where the first one's figure is in doubt (a busy machine, a tiny model)
    assert [r.strategy for r in sent] == ["none", "draft-model"] + (["draft-model", "none"] if card.second_pair_why
                                                                    else [])
    assert sent[0].messages == sent[1].messages and sent[0].messages[-1].content.startswith("hello there")
    assert sent[0].config.seed == sent[1].config.seed == card.seed is not None
    # each run measures what a plain step costs while it runs (not from the answer before): the machine's speed
    assert sent[0].config.own_baseline and sent[1].config.own_baseline
    assert card.plain.plain_step_s and card.fast.plain_step_s and card.slowdown is not None
    assert card.done and not card.error and card.plain.strategy == "none" and card.fast.strategy == "draft-model"
    assert card.identical  # greedy in fp32: speculation is lossless
    assert card.speedup == pytest.approx(card.fast.tokens_per_s / card.plain.tokens_per_s)
    text = w.view.toPlainText()
    assert "Compare: plain decoding vs draft-model" in text and "identical outputs" in text
    assert text.count("Speedup:") == 1  # one headline figure
    assert (f"Speedup: {card.headline:.2f}×" if card.headline is not None else "too much to say") in text
    assert f"{card.plain.tokens_per_s:.1f}" in text and f"{card.fast.tokens_per_s:.1f}" in text
    # the speculative run's own live figure is the one the dock shows for it: one definition everywhere
    last = card.fast_again or card.fast
    live = speedup_text(card.fast.live, card.fast.live_err)
    assert card.fast.live is not None and f"run's own live figure: {live}" in text
    assert w.plots.notes.text().startswith("Compare, run 4 of 4, plain" if card.second_pair_why else
                                           "Compare, run 2 of 2, draft-model")  # the dock says whose figures
    if not card.second_pair_why:
        assert w.plots.stat_labels["speedup"].text() == speedup_text(last.live, last.live_err)
    # a card, not a turn: the conversation and its file are unchanged, and the chat goes on
    assert w.chat.current.turns == turns_before
    assert saved_history(tmp_path).load_all()[0] == saved_before
    assert w.state == "ready" and w.composer.send_button.isEnabled()
    snap(w, "compare")
    w.send_text("and another")
    ok, _ = wait_reply(qtbot, w)
    assert ok and "Compare: plain decoding vs draft-model" in w.view.toPlainText()


def test_the_compare_card_says_when_outputs_differ():
    plain = RunResult("none", (1, 2, 3, 4), 4, 10.0, None, "length")
    fast = RunResult("draft-model", (1, 2, 9, 4), 4, 25.0, 0.5, "length", 2.41, 0.3)
    card = Comparison("draft-model", 7, 0.8, plain, fast)
    assert card.speedup == pytest.approx(2.5) and card.identical is False and card.first_difference == 2
    from specula.app.comparecard import card_html
    from specula.app.theme import LIGHT

    html = card_html(card, LIGHT)
    assert "outputs differ" in html and "from token 3" in html and "2.50×" in html and "Sampling" in html
    assert "The draft-model run's own live figure: 2.41× ±0.30" in html  # the run's own figure, as the dock shows it


def test_stop_ends_a_comparison(make_window, qtbot, tiny_session):
    w = make_window(strategy="prompt-lookup", max_new_tokens=300)
    w.send_text("hello hello hello")
    wait_reply(qtbot, w)
    hold, release = hold_after_step(tiny_session)  # the worker waits after step 3 until Stop was pressed
    w.compare_action.trigger()
    qtbot.waitUntil(hold.is_set, timeout=60_000)
    qtbot.waitUntil(lambda: "running…" in w.view.toPlainText(), timeout=10_000)
    snap(w, "compare-running")
    assert w.state == "generating" and w.composer.stop_button.isEnabled() and not w.send_text("not now")
    assert not w.compare_action.isEnabled() and not w.regenerate_action.isEnabled()
    with qtbot.waitSignal(w.compare.finished, timeout=60_000) as blocker:
        w.composer.stop_button.click()
        release.set()
    card = blocker.args[0]
    assert card.error == "stopped" and card.plain is None and "Stopped." in w.view.toPlainText()
    assert w.state == "ready" and w.compare_action.isEnabled()


def test_compare_measures_what_the_answer_cost_and_gives_the_same_figure_twice(make_window, qtbot, tiny_session):
    """A strategy that learns from the model's answers (suffix, auto's members) re-created the user's answer from
    its own copy: Compare's runs learn nothing, and the strategy's run leaves out every version of the answer and
    the plain run's, so the same Compare twice drafts the same (seeded: the same steps every time)."""
    w = make_window(strategy="suffix", max_new_tokens=40, seed=7, temperature=0.5)
    w.send_text("hello there, tell me a story about a cat")
    ok, answer = wait_reply(qtbot, w)
    assert ok
    corpus = tiny_session.drafter("suffix", {}).index
    learned = len(corpus)
    assert learned > 0  # the user's answer joined the corpus
    sent = spy_requests(w)
    cards = [run_compare(qtbot, w), run_compare(qtbot, w)]
    assert len(corpus) == learned  # Compare's runs add nothing
    assert all(not r.config.learn for r in sent)
    plain_run, fast_run = sent[0], sent[1]
    assert plain_run.config.leave_out == ()
    assert fast_run.config.leave_out == (answer.text, cards[0].plain.text)
    first, second = (c.fast for c in cards)
    assert first.token_ids == second.token_ids and first.acceptance == second.acceptance
    assert first.new_tokens == second.new_tokens


def run(strategy, tps, live=None, step_ms=None, err_ms=0.2):
    step = None if step_ms is None else step_ms / 1000
    return RunResult(strategy, (1, 2, 3), 3, tps, 0.8 if strategy != "none" else None, "length", live,
                     0.02 if live else None, step, err_ms / 1000 if step else None)


def test_one_headline_figure_from_one_pair_or_two_and_none_where_the_machine_was_too_unsteady():
    from specula.app.comparecard import card_html
    from specula.app.theme import LIGHT

    # steady, and the live figure agrees: the measured ratio, with no second pair
    calm = Comparison("auto", 1, 0.0, run("none", 10.0, step_ms=50), run("auto", 15.0, 1.45, step_ms=51))
    assert calm.wants_second_pair() == "" and calm.headline == pytest.approx(1.5)
    html = card_html(calm, LIGHT)
    assert html.count("Speedup:") == 1 and "Speedup: <span" in html and "1.50×" in html and "one machine speed" in html
    # the machine slowed during the second run: the figure at one speed is the headline, and a second pair is due
    slowed = Comparison("auto", 1, 0.0, run("none", 20.0, step_ms=40), run("auto", 15.0, 1.5, step_ms=80))
    assert not slowed.steady and slowed.headline == pytest.approx(1.5)  # 0.75 measured x 2 slower
    assert "speed changed" in slowed.wants_second_pair()
    # steady but far from the live figure: a second pair is due
    doubtful = Comparison("auto", 1, 0.0, run("none", 10.0, step_ms=50), run("auto", 20.5, 1.4, step_ms=50))
    assert "disagreed" in doubtful.wants_second_pair()
    unsure = replace(doubtful, fast=replace(doubtful.fast, live=1.65, live_err=0.5))  # a wide live figure: all the same
    assert "disagreed" in unsure.wants_second_pair()
    # two pairs that agree: their geometric mean, and no third
    agreed = replace(doubtful, second_pair_why=doubtful.wants_second_pair(), fast_again=run("auto", 17.5, 1.5, step_ms=50),
                     plain_again=run("none", 10.0, step_ms=50))
    assert agreed.headline == pytest.approx((2.05 * 1.75) ** 0.5) and agreed.wants_second_pair() == ""
    html = card_html(agreed, LIGHT)
    assert html.count("Speedup:") == 1 and f"{agreed.headline:.2f}×" in html and "2.05× and 1.75×" in html
    # two pairs that disagree: no number
    torn = replace(agreed, fast_again=run("auto", 11.0, 1.5, step_ms=50))
    assert torn.unsteady and torn.headline is None
    html = card_html(torn, LIGHT)
    assert "changed too much to say" in html and "2.05× and 1.10×" in html and "quiet machine" in html


def test_a_second_pair_runs_the_other_way_round_when_the_first_is_in_doubt(make_window, qtbot, monkeypatch):
    monkeypatch.setattr(Comparison, "wants_second_pair", lambda self: "" if self.second_pair_why else "a test")
    w = make_window(strategy="prompt-lookup", max_new_tokens=30)
    w.send_text("hello there, tell me a story about a cat")
    wait_reply(qtbot, w)
    sent = spy_requests(w)
    card = run_compare(qtbot, w)
    assert [r.strategy for r in sent] == ["none", "prompt-lookup", "prompt-lookup", "none"]
    assert len({r.config.seed for r in sent}) == 1 and card.second_pair is not None and card.identical
    assert sent[2].config.leave_out == sent[1].config.leave_out and sent[3].config.leave_out == ()
    text = w.view.toPlainText()
    assert "run four times" in text and "because a test" in text and text.count("Speedup:") == 1
    snap(w, "compare-two-pairs")
