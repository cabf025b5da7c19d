"""The worker thread: events out, cancel within a step, errors as events, strategy switches."""

import queue
import threading

import pytest

from specula.engine.api.events import Failed, Finished, Loaded, Started, Step
from specula.engine.api.prompts import Message
from specula.engine.api.types import DecodeConfig, GenerateRequest, LoadRequest, ModelChoice
from specula.engine.serving.worker import Worker
from specula.engine.serving.session import Session
from tests.support.tiny import loaded, perturbed, tiny_model


class FakeTokenizer:
    """Enough of a tokenizer for the session: ids are characters' code points modulo the vocabulary."""

    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 64 for c in text] or [0]

    def decode(self, ids, **kwargs):
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture()
def worker():
    target = tiny_model(vocab=64, seed=2)
    session = Session()
    t = loaded(target)
    t.tokenizer = FakeTokenizer()
    session.use(t, loaded(perturbed(target)))
    r = Worker(session=session).start()
    yield r
    r.stop()


def request(strategy="none", n=40, prompt="hello there"):
    return GenerateRequest((Message("user", prompt),), strategy, DecodeConfig(max_new_tokens=n), chat=False)


def collect(r: Worker, rid: int, timeout=60.0):
    events = []
    while True:
        event = r.events.get(timeout=timeout)
        assert event.request_id == rid
        events.append(event)
        if isinstance(event, (Finished, Failed, Loaded)):
            return events


def test_events_arrive_in_order(worker):
    rid = worker.submit(request())
    events = collect(worker, rid)
    assert isinstance(events[0], Started)
    assert all(isinstance(e, Step) for e in events[1:-1])
    assert isinstance(events[-1], Finished) and len(events[-1].token_ids) == 40
    assert "".join(t.text for e in events[1:-1] for t in e.tokens) == events[-1].text


def test_strategy_switch_keeps_the_loaded_target(worker):
    model = worker.session.target.model
    outputs = {}
    for strategy in ("none", "prompt-lookup", "draft-model", "layer-skip", "none"):
        rid = worker.submit(request(strategy))
        outputs.setdefault(strategy, collect(worker, rid)[-1].token_ids)
        assert worker.session.target.model is model
    assert len(set(outputs.values())) == 1  # greedy: all strategies agree


def test_cancel_takes_effect_within_one_step():
    gate = threading.Event()
    release = threading.Event()
    target = tiny_model(vocab=64, seed=2)
    session = Session()
    t = loaded(target)
    t.tokenizer = FakeTokenizer()
    session.use(t)
    seen: queue.Queue = queue.Queue()

    def sink(event):
        seen.put(event)
        if isinstance(event, Step) and event.step == 3:
            gate.set()
            release.wait(10)  # hold the worker inside step 3 while the cancel arrives

    r = Worker(sink=sink, session=session).start()
    try:
        rid = r.submit(request(n=500))
        assert gate.wait(30)
        r.cancel(rid)
        release.set()
        events = []
        while not events or not isinstance(events[-1], (Finished, Failed)):
            events.append(seen.get(timeout=30))
        finished = events[-1]
        assert isinstance(finished, Finished) and finished.reason == "cancelled"
        last_step = max(e.step for e in events if isinstance(e, Step))
        assert last_step == 3  # no further step ran after the cancel
    finally:
        release.set()
        r.stop()


def test_an_error_becomes_an_event_and_the_worker_survives(worker):
    rid = worker.submit(request(strategy="no-such-strategy"))
    failed = collect(worker, rid)[-1]
    assert isinstance(failed, Failed) and "unknown strategy" in failed.message
    rid = worker.submit(GenerateRequest((Message("user", "x" * 600),), "none", DecodeConfig(), chat=False))
    failed = collect(worker, rid)[-1]
    assert isinstance(failed, Failed) and "context window" in failed.message
    rid = worker.submit(request())
    assert isinstance(collect(worker, rid)[-1], Finished)


def test_a_failed_load_is_reported(worker):
    rid = worker.submit(LoadRequest(ModelChoice("/no/such/model.gguf")))
    failed = collect(worker, rid)[-1]
    assert isinstance(failed, Failed) and "not found" in failed.message
    rid = worker.submit(request())  # the previous model is still usable
    assert isinstance(collect(worker, rid)[-1], Finished)


def test_cancel_all_drops_queued_requests(worker):
    first = worker.submit(request(n=300))
    second = worker.submit(request(n=300))
    worker.cancel()
    reasons = {}
    while len(reasons) < 2:
        event = worker.events.get(timeout=60)
        if isinstance(event, (Finished, Failed)):
            reasons[event.request_id] = getattr(event, "reason", "failed")
    assert reasons[second] == "cancelled"
    assert reasons[first] in ("cancelled", "length")


def _training_worker(tiny_folder):
    from specula.engine.models.loading import load_model

    session = Session()
    session.use(load_model(ModelChoice(str(tiny_folder), "cpu", "fp32")))
    return Worker(session=session).start()


@pytest.fixture
def own_data(tmp_path, monkeypatch):
    """A data folder of the test's own: the heads it trains are not found by the tests after it."""
    monkeypatch.setenv("SPECULA_DATA_DIR", str(tmp_path / "data"))


def test_a_training_request_trains_a_head_and_offers_its_strategy(tiny_folder, own_data):
    from specula.engine.api.events import Trained, Training
    from specula.engine.api.types import TrainRequest

    r = _training_worker(tiny_folder)
    try:
        rid = r.submit(TrainRequest("medusa", tokens=150, epochs=1, batch=4))
        events = collect(r, rid, timeout=300)
        assert any(isinstance(e, Training) and e.message.startswith("answers") for e in events), events
        trained = [e for e in events if isinstance(e, Trained)]
        assert len(trained) == 1 and trained[0].kind == "medusa" and "held-out" in trained[0].summary
        assert isinstance(events[-1], Loaded) and "medusa" in events[-1].strategies
        got = collect(r, r.submit(GenerateRequest((Message("user", "hi"),), "medusa", DecodeConfig(max_new_tokens=8))))
        assert isinstance(got[-1], Finished) and got[-1].totals.new_tokens > 0
    finally:
        r.stop()


def test_a_cancelled_training_run_says_so_and_keeps_its_answers(tiny_folder, own_data):
    from specula.engine.api.events import Training
    from specula.engine.api.types import TrainRequest
    from specula.engine.heads.train import default_out

    r = _training_worker(tiny_folder)
    try:
        rid = r.submit(TrainRequest("eagle", tokens=100000, epochs=1, batch=4))
        first = r.events.get(timeout=120)
        while not (isinstance(first, Training) and "tokens/s" in first.message):  # a first batch is stored
            first = r.events.get(timeout=120)
        r.cancel(rid)
        events = collect(r, rid, timeout=120)
        assert isinstance(events[-1], Failed) and "cancelled" in events[-1].message
        answers = default_out(r.session.target.name, "eagle") / "training" / "answers.jsonl"
        assert answers.is_file() and answers.read_text().count("\n") >= 1
        assert "eagle" not in r.session.describe().strategies
    finally:
        r.stop()


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_a_training_run_cancelled_before_it_kept_anything_leaves_no_folder(tiny_folder, tmp_path, kind):
    from specula.engine.api.errors import TrainingCancelled
    from specula.engine.heads.train import TrainOptions, run_training
    from specula.engine.models.loading import load_model

    target = load_model(ModelChoice(str(tiny_folder), "cpu", "fp32"))
    with pytest.raises(TrainingCancelled):
        run_training(target, TrainOptions(kind=kind, tokens=1000, out=tmp_path / "new" / "head"), should_stop=lambda: True)
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a data folder the user named, with their own file in it, stays as it was
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(TrainingCancelled):
        run_training(target, TrainOptions(kind=kind, tokens=1000, out=tmp_path / "h", data=tmp_path / "mine"),
                     should_stop=lambda: True)
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
