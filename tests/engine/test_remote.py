"""The remote backend without a real server: recorded vLLM output (metrics page, streamed chunks) and a
scripted fake server for errors, stops and dropped connections. test_remote_vllm.py runs a real one."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from specula.engine.api.errors import ContextTooLongError
from specula.engine.api.events import Failed, Finished, Loaded, Origin, ServerStats, Started, Step
from specula.engine.api.metrics import LiveMetrics
from specula.engine.api.prompts import Message
from specula.engine.api.types import DecodeConfig, GenerateRequest, RemoteLoadRequest
from specula.engine.remote.backend import RemoteBackend, probe, server_for
from specula.engine.remote.chunks import ChunkReader, chunk_tokens, reconcile
from specula.engine.remote.http import AuthError, RemoteError, Server, get_json, http_error, normalize_url, parse_event
from specula.engine.remote.keys import resolve_api_key
from specula.engine.remote.telemetry import SpecCounters, parse_metrics
from tests.support.fake_server import FakeServer

DATA = Path(__file__).parent / "data"
ASK = GenerateRequest((Message("user", "hi"),), config=DecodeConfig(max_new_tokens=50))


def connect(fake: FakeServer, **kwargs) -> RemoteBackend:
    backend = RemoteBackend()
    backend.load(RemoteLoadRequest(fake.url, **kwargs))
    return backend


def recorded_events() -> list[dict]:
    lines = (DATA / "vllm_stream.txt").read_text().splitlines()
    payloads = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    return [parse_event(p) for p in payloads[:-1]]


# -- recorded vLLM output ---------------------------------------------------------------------------------
def test_metrics_parser_reads_the_recorded_vllm_page():
    counters = parse_metrics((DATA / "vllm_metrics.txt").read_text())
    assert counters == SpecCounters(38.0, 190.0, 50.0, (20.0, 8.0, 8.0, 7.0, 7.0))
    assert counters.acceptance_rate == pytest.approx(50 / 190)
    assert counters.mean_accepted_length == pytest.approx(1 + 50 / 38)
    assert counters.position_rates[0] == pytest.approx(20 / 38)
    assert parse_metrics((DATA / "vllm_metrics.txt").read_text(), model="another-model") is None


def test_metrics_without_spec_decode_counters_say_none():
    assert parse_metrics("# HELP vllm:num_requests_running x\nvllm:num_requests_running 0.0\n") is None
    # the whole page of a plain vLLM 0.32 (CPU) server after a request
    assert parse_metrics((DATA / "vllm_metrics_plain.txt").read_text()) is None


def test_counter_differences_are_what_happened_in_between():
    before = SpecCounters(2, 10, 4, (2, 1, 1))
    after = SpecCounters(5, 25, 13, (5, 4, 2, 2))
    assert after - before == SpecCounters(3, 15, 9, (3, 3, 1, 2))


def test_recorded_stream_splits_into_tokens_that_rebuild_the_text():
    reader = ChunkReader()
    chunks = [c for c in (reader.read(e) for e in recorded_events()) if c is not None]
    content = "".join(c.content for c in chunks)
    steps = [chunk_tokens(c, n, inferred=True) for n, c in enumerate(chunks) if c.ids]
    assert "".join(t.text for step in steps for t in step) == content
    assert sum(len(c.ids) for c in chunks) == sum(len(step) for step in steps)
    multi = [step for step in steps if len(step) > 1]
    assert multi, "the recorded answer copies its prompt: some steps accepted drafts"
    for step in steps:  # a step's accepted drafts, then the target's own token
        assert step[-1].origin == Origin.TARGET
        assert all(t.origin == Origin.DRAFT and t.draft_pos == i for i, t in enumerate(step[:-1]))
    assert chunks[0].usage["prompt_tokens"] > 0


def test_a_character_split_across_tokens_is_never_broken():
    reader = ChunkReader()
    raw = "Grüße".encode()
    u = raw.index("ü".encode())
    pieces = [raw[:u + 1], raw[u + 1:]]  # the ü's two bytes in two tokens
    event = {"choices": [{"delta": {"content": "Grüße"}, "token_ids": [1, 2],
                          "logprobs": {"content": [{"token": "x", "bytes": list(p)} for p in pieces]}}]}
    chunk = reader.read(event)
    assert chunk.texts == ("Gr", "üße")


def test_reconcile_blanks_tokens_the_text_leaves_out():
    assert reconcile(["Hi", "<|im_end|>"], "Hi") == ("Hi", "")
    assert reconcile(["a", "b"], "abc") == ("a", "bc")


# -- URLs, errors, keys -------------------------------------------------------------------------------------
@pytest.mark.parametrize("url", ["", "ftp://host", "file:///etc/passwd", "http://", "http://h:port", "http://h/?q=1",
                                 "http://[::1", "http://my host:8000", "http://h\x1b[31m"])
def test_only_plain_http_and_https_urls(url):
    with pytest.raises(RemoteError):
        normalize_url(url)


def test_urls_keep_or_add_the_api_prefix():
    assert Server("http://h:1/v1/").api == "http://h:1/v1"
    assert Server("https://h").api == "https://h/v1"
    assert Server("http://h:1/v1").root == "http://h:1"


def test_a_key_goes_unencrypted_only_to_this_machine_or_when_the_user_allows_it():
    for url in ("http://127.0.0.1:8000", "http://localhost:1", "http://[::1]:2", "https://example.com"):
        assert Server(url, "sk-1").api_key == "sk-1"
    with pytest.raises(RemoteError, match="unencrypted over http:// to example.com: use https://, or allow it"):
        Server("http://example.com:8000", "sk-1")
    assert Server("http://example.com:8000", "sk-1", allow_http_key=True).api_key == "sk-1"
    assert Server("http://example.com:8000").api_key is None  # no key: nothing to protect


def test_a_key_for_plain_http_elsewhere_stops_the_command_line_unless_allowed(capsys, monkeypatch):
    from specula.engine.cli.main import main

    monkeypatch.setenv("SPECULA_TEST_KEY", "sk-1")
    args = ["generate", "--backend", "remote", "--server", "http://192.0.2.1:9", "--api-key-env", "SPECULA_TEST_KEY",
            "--prompt", "hi"]
    assert main(args) == 2
    assert "unencrypted over http:// to 192.0.2.1" in capsys.readouterr().err
    assert main(["generate", "--backend", "remote", "--server", "http://[::1", "--prompt", "hi"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "specula: error: server URL is not valid (Invalid IPv6 URL): 'http://[::1'")


def test_http_errors_become_one_line_messages():
    assert isinstance(http_error("/x", 401, "Unauthorized", ""), AuthError)
    too_long = http_error("/v1/chat/completions", 400, "Bad Request",
                          json.dumps({"error": {"message": "This model's maximum context length is 2048 tokens."}}))
    assert isinstance(too_long, ContextTooLongError)
    broken = http_error("/v1/chat/completions", 500, "Internal Server Error",
                        json.dumps({"error": {"message": "engine\ncrashed"}}))
    assert str(broken) == "the server answered HTTP 500 for /v1/chat/completions: engine crashed"
    assert (broken.status, too_long.status) == (500, 400)  # what a caller decides on, not the text


def test_api_key_comes_from_the_named_variable(monkeypatch):
    monkeypatch.setenv("SPECULA_TEST_KEY", "sk-123")
    assert resolve_api_key("http://h:1", "SPECULA_TEST_KEY") == "sk-123"
    monkeypatch.delenv("SPECULA_TEST_KEY")
    with pytest.raises(RemoteError, match="SPECULA_TEST_KEY is not set"):
        resolve_api_key("http://h:1", "SPECULA_TEST_KEY")
    with pytest.raises(RemoteError, match="not an environment variable name"):
        resolve_api_key("http://h:1", "MY-KEY")


def test_a_server_that_wants_a_key_refuses_without_one_and_answers_with_it(monkeypatch):
    with FakeServer(api_key="sk-good") as fake:
        with pytest.raises(AuthError, match="refused the API key"):
            connect(fake, use_keyring=False)
        monkeypatch.setenv("SPECULA_TEST_KEY", "sk-good")
        backend = connect(fake, api_key_env="SPECULA_TEST_KEY")
        events = list(backend.generate(ASK))
    assert events[-1].text == "Hello there!"


def test_connection_refused_is_a_clear_message():
    with FakeServer() as fake:
        url = fake.url
    with pytest.raises(RemoteError, match="connection refused"):
        probe(server_for(url, use_keyring=False))


def test_a_server_that_answers_no_http_is_named_with_what_it_sent_as_text():
    """h11 quotes the line it could not read as bytearray(b'...'): the message shows the line itself."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"garbage garbage\r\n\r\n")
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(RemoteError) as exc:
            get_json(Server(f"http://127.0.0.1:{port}", timeout_s=30), "/v1/models")
    finally:
        listener.close()
    message = str(exc.value)
    assert "bytearray" not in message and "'garbage garbage'" in message and "does not answer in HTTP" in message
    with pytest.raises(RemoteError, match="malformed stream event"):  # nested too deeply for Python's reader
        parse_event("[" * 100_000 + "]" * 100_000)


def test_a_missing_model_names_the_ones_served():
    with FakeServer() as fake:
        with pytest.raises(RemoteError, match="no model 'other'; it serves: fake-model"):
            connect(fake, model="other")


# -- streaming through the fake server ---------------------------------------------------------------------------
def test_a_streamed_answer_becomes_engine_events():
    with FakeServer(steps=[["Hel", "lo"], [" wor", "ld", "!"], [" ok"]], delay_s=0.3) as fake:
        backend = connect(fake)
        events = list(backend.generate(ASK, request_id=5))
        body = fake.requests[-1]
    assert body["stream"] and body["return_token_ids"] and body["logprobs"] and body["model"] == "fake-model"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert isinstance(events[0], Started) and events[0].prompt_tokens == 7
    steps = [e for e in events if isinstance(e, Step)]
    assert [[t.text for t in s.tokens] for s in steps] == [["Hel", "lo"], [" wor", "ld", "!"], [" ok"]]
    assert all(s.inferred and s.rejected == () for s in steps)
    assert [[t.origin for t in s.tokens] for s in steps][1] == [Origin.DRAFT, Origin.DRAFT, Origin.TARGET]
    assert [s.accepted for s in steps] == [1, 2, 1]  # the last step's own token was the stop
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reason == "eos"
    assert finished.text == "Hello world! ok" and finished.token_ids == tuple(range(100, 106))
    stats = [e for e in events if isinstance(e, ServerStats)]
    assert stats and stats[-1].drafts == 3 and stats[-1].accepted == 4  # the fake booked 2+3+2 tokens
    assert finished.totals.accepted == 4 and finished.totals.drafted == 12
    assert finished.totals.accepted_lengths == (2, 1)
    assert finished.speedup is None  # no baseline server: no speedup is invented


def test_live_metrics_take_acceptance_from_the_server_counters():
    with FakeServer(steps=[["a"], ["b", "c"], ["d", "e", "f"]]) as fake:
        events = list(connect(fake).generate(ASK))
    live = LiveMetrics()
    for event in events:
        if isinstance(event, Step):
            live.add(event)
        elif isinstance(event, ServerStats):
            live.add_server(event)
    assert live.new_tokens == 6 and live.forwards == 3
    assert live.acceptance_rate == pytest.approx(4 / 12)
    assert live.accepted_lengths == [1, 3]
    assert live.per_position[:3] == [pytest.approx(2 / 3), pytest.approx(1 / 3), pytest.approx(1 / 3)]


def test_a_server_without_counters_gets_no_inferred_colours():
    with FakeServer(steps=[["a", "b"], ["c"]], vllm=False) as fake:
        backend = connect(fake)
        events = list(backend.generate(ASK))
        body = fake.requests[-1]
    assert "return_token_ids" not in body and "logprobs" not in body
    steps = [e for e in events if isinstance(e, Step)]
    assert all(not s.inferred and all(t.origin == Origin.TARGET for t in s.tokens) for s in steps)
    assert not any(isinstance(e, ServerStats) for e in events)
    assert events[-1].text == "abc"
    assert "no speculative decoding counters" in backend.describe().notes[0]


def test_stop_closes_the_stream_at_once():
    stop = threading.Event()
    with FakeServer(steps=[["a"], ["b"], ["c"], ["d"]], stall_after=2) as fake:
        backend = connect(fake)
        seen = []
        for event in backend.generate(ASK, should_stop=stop.is_set):
            seen.append(event)
            if isinstance(event, Step) and event.step == 1:
                stop.set()  # the server now stalls: only closing the stream ends the wait
        assert isinstance(seen[-1], Finished) and seen[-1].reason == "cancelled"
        assert seen[-1].text == "ab"
        fake.released.set()
        assert list(backend.generate(ASK))[-1].text == "abcd"  # the next request works


def test_stop_works_while_the_server_holds_back_its_answer():
    stop = threading.Event()
    with FakeServer(hold_headers=True) as fake:
        backend = connect(fake)
        threading.Timer(0.3, stop.set).start()
        events = list(backend.generate(ASK, should_stop=stop.is_set))
        assert not fake.answered.is_set()  # the reply ended before the server sent a byte
        fake.released.set()
    assert isinstance(events[-1], Finished) and events[-1].reason == "cancelled" and events[-1].text == ""


def test_a_server_dying_mid_answer_is_an_error_after_the_tokens_it_sent():
    with FakeServer(steps=[["a"], ["b"], ["c"]], die_after=2) as fake:
        backend = connect(fake)
        seen = []
        with pytest.raises(RemoteError, match="before the answer ended|broke"):
            for event in backend.generate(ASK):
                seen.append(event)
    assert "".join(t.text for e in seen if isinstance(e, Step) for t in e.tokens) == "ab"


def test_a_malformed_stream_is_reported():
    with FakeServer(steps=[["a"], ["b"]], malformed_after=1) as fake:
        with pytest.raises(RemoteError, match="malformed stream"):
            list(connect(fake).generate(ASK))


def test_http_errors_during_a_request_are_reported():
    with FakeServer(status=400, error_body=json.dumps({"error": {"message": "maximum context length is 2048"}})) as fake:
        with pytest.raises(ContextTooLongError):
            list(connect(fake).generate(ASK))
    with FakeServer(status=503) as fake:
        with pytest.raises(RemoteError, match="HTTP 503.*scripted failure"):
            list(connect(fake).generate(ASK))


def test_a_baseline_server_gives_a_measured_speedup():
    with FakeServer(steps=[["x"]] * 8, delay_s=0.02) as plain, FakeServer(steps=[["a", "b"]] * 4) as fast:
        backend = connect(fast, baseline_server=plain.url)
        assert backend.baseline is not None and backend.baseline.a > 0.01
        assert plain.requests[-1]["ignore_eos"] is True
        finished = list(backend.generate(ASK))[-1]
    assert finished.speedup is not None and finished.speedup > 0
    assert any("Speedup is against" in note for note in backend.describe().notes)


# -- through the worker ----------------------------------------------------------------------------------
def test_the_worker_switches_backends_and_keeps_the_old_one_when_a_connect_fails():
    from specula.engine.api.types import TrainRequest
    from specula.engine.serving.worker import Worker
    from specula.engine.serving.session import Session
    from tests.engine.test_worker import FakeTokenizer
    from tests.support.tiny import loaded, tiny_model

    session = Session()
    target = loaded(tiny_model(vocab=64, seed=2))
    target.tokenizer = FakeTokenizer()
    session.use(target)
    worker = Worker(session=session).start()
    try:
        def wait(rid):
            events = []
            while True:
                event = worker.events.get(timeout=60)
                events.append(event)
                if event.request_id == rid and isinstance(event, (Loaded, Failed, Finished)):
                    return events

        assert session.describe().backend == "local"
        failed = wait(worker.submit(RemoteLoadRequest("http://127.0.0.1:9")))[-1]
        assert isinstance(failed, Failed) and "cannot reach" in failed.message
        assert worker.backend is worker.session  # still the local engine
        with FakeServer() as fake:
            loaded = wait(worker.submit(RemoteLoadRequest(fake.url)))[-1]
            assert loaded.backend == "remote" and loaded.strategies == ("server",)
            assert wait(worker.submit(ASK))[-1].text == "Hello there!"
            refused = wait(worker.submit(TrainRequest()))[-1]
            assert isinstance(refused, Failed) and "needs a local model" in refused.message
    finally:
        worker.stop()


# -- command line ------------------------------------------------------------------------------------------
def test_generate_with_the_remote_backend(capsys):
    from specula.engine.cli.main import main

    with FakeServer(steps=[["Hel", "lo"], ["!"]]) as fake:
        assert main(["generate", "--backend", "remote", "--server", fake.url, "--prompt", "hi"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Hello!"
    assert "acceptance" in err and "server-wide counters" in err
    assert main(["generate", "--backend", "remote", "--prompt", "hi"]) == 2
    assert "needs --server" in capsys.readouterr().err
    assert main(["generate", "--backend", "remote", "--server", "ftp://x", "--prompt", "hi"]) == 2
    assert "http:// or https://" in capsys.readouterr().err


def test_escape_sequences_from_a_server_never_reach_the_terminal(capsys):
    from specula.engine.api.errors import terminal_safe
    from specula.engine.cli.main import main

    with FakeServer(steps=[["\x1b]0;pwned\x07\x1b[2JHel", "lo\x1b[31m"], ["!\r\x9b"]]) as fake:
        assert main(["generate", "--backend", "remote", "--server", fake.url, "--prompt", "hi"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "Hello!" and "\x1b" not in out + err
    assert terminal_safe("line 1\n\tline 2 é\x00\x1bc") == "line 1\n\tline 2 é"


def test_terminal_chat_through_a_server_keeps_the_conversation(capsys, monkeypatch):
    from specula.engine.cli.main import main

    lines = iter(["hi", "and again", "/quit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    with FakeServer(steps=[["Hel", "lo"], ["!"]]) as fake:
        assert main(["chat", "--backend", "remote", "--server", fake.url]) == 0
        second = fake.requests[-1]["messages"]
    out = capsys.readouterr().out
    assert "Strategy: server" in out and out.count("Hello!") == 2 and "server-wide counters" in out
    assert second == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "and again"}]


def test_ctrl_c_at_the_terminal_prompt_does_not_end_the_chat(capsys, monkeypatch):
    from specula.engine.cli.main import main

    def ctrl_c():
        raise KeyboardInterrupt

    script = iter([lambda: "hi", ctrl_c, ctrl_c, lambda: "and again", lambda: "/quit"])  # two quick Ctrl-C
    monkeypatch.setattr("builtins.input", lambda prompt="": next(script)())
    with FakeServer(steps=[["Hel", "lo"], ["!"]]) as fake:
        assert main(["chat", "--backend", "remote", "--server", fake.url]) == 0
        second = fake.requests[-1]["messages"]
    assert capsys.readouterr().out.count("/quit or Ctrl-D leaves") == 2
    assert [m["content"] for m in second] == ["hi", "Hello!", "and again"]  # the conversation went on


def test_an_unknown_strategy_in_the_terminal_chat_says_so_and_keeps_the_current_one(capsys, monkeypatch):
    from specula.engine.cli.main import main

    lines = iter(["/strategy eagel\x1b[2J", "/strategy server", "/quit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    with FakeServer(steps=[]) as fake:
        assert main(["chat", "--backend", "remote", "--server", fake.url]) == 0
    out = capsys.readouterr().out
    assert "[unknown strategy 'eagel' for this model; it can use: server]" in out and "\x1b" not in out
    assert "[strategy: server]" in out


def test_a_server_that_never_answers_is_reported_with_the_time_waited():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts connections and never says a word
    port = listener.getsockname()[1]
    try:
        with pytest.raises(RemoteError, match=r"^the server at http://127.0.0.1:\d+ did not answer within 1 s$"):
            get_json(Server(f"http://127.0.0.1:{port}"), "/v1/models", timeout=1.0)
    finally:
        listener.close()


# -- what a broken or hostile server sends ------------------------------------------------------------------
ESCAPES = "\x1b]0;pwned\x07\x1b[31mRED\x1b[0m"


@pytest.mark.parametrize("choice, field", [
    ({"delta": {"content": "Hi"}, "token_ids": ["x", None]}, "'token_ids'"),
    ({"delta": {"content": "Hi"}, "token_ids": [1, -2]}, "'token_ids'"),
    ({"delta": {"content": "Hi"}, "token_ids": [1],
      "logprobs": {"content": [{"token": "Hi", "bytes": [300, -1]}]}}, "'bytes'"),
    ({"delta": {"content": "Hi"}, "finish_reason": ["stop"]}, "'finish_reason' is a list"),
    ({"delta": {"content": 12}}, "'content' is a number"),
    (5, "a choice is a number"),
])
def test_a_malformed_chunk_names_the_field(choice, field):
    with pytest.raises(RemoteError, match=f"^the server sent a malformed stream chunk: {field}"):
        ChunkReader().read({"choices": [choice]})
    with pytest.raises(RemoteError, match="^the server sent a malformed stream chunk: 'choices' is a number"):
        ChunkReader().read({"choices": 5})


@pytest.mark.parametrize("event, field", [
    ({"choices": [{"index": 0, "delta": {"content": "Hi"}, "token_ids": ["x", None]}]}, "'token_ids'"),
    ({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": ["stop"]}]}, "'finish_reason'"),
    ({"choices": 5}, "'choices'"),
])
def test_a_malformed_chunk_is_one_line_and_exit_2(capsys, event, field):
    from specula.engine.cli.main import main

    with FakeServer(raw_events=[event]) as fake:
        code = main(["generate", "--backend", "remote", "--server", fake.url, "--prompt", "hi"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("[")]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("specula: error: the server sent a malformed stream chunk: " + field)


def test_a_huge_draft_position_on_the_metrics_page_is_ignored():
    page = ('vllm:spec_decode_num_drafts_total{model_name="m"} 4\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="100000"} 1\n')
    counters = parse_metrics(page)
    assert counters.drafts == 4 and counters.per_position == (3.0,)


def test_names_a_server_gives_reach_the_terminal_without_escapes(capsys, monkeypatch):
    from specula.engine.cli.main import main

    lines = iter(["/quit"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    with FakeServer(model="m" + ESCAPES, version="0.9" + ESCAPES) as fake:
        info = probe(server_for(fake.url, use_keyring=False))
        assert main(["chat", "--backend", "remote", "--server", fake.url]) == 0
    assert info.model == "mRED" and info.version == "0.9RED" and info.describe.startswith("vLLM 0.9RED at ")
    out, err = capsys.readouterr()
    assert "mRED on vLLM 0.9RED" in out and "\x1b" not in out + err and "\x07" not in out + err


@pytest.mark.parametrize("url", ["http://alice:s3cret@127.0.0.1:1", "https://:s3cret@h/v1", "http://alice@h:2"])
def test_a_url_with_credentials_is_refused_without_echoing_them(capsys, url):
    from specula.engine.cli.main import main

    with pytest.raises(RemoteError, match="must not contain a user name or password") as refused:
        normalize_url(url)
    assert "s3cret" not in str(refused.value) and "alice" not in str(refused.value)
    assert main(["generate", "--backend", "remote", "--server", url, "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "alice" not in err and "--api-key-env" in err
    assert len(err.strip().splitlines()) == 1


def test_an_html_error_page_is_named_as_one_without_its_markup():
    page = ("<!DOCTYPE html><html>\n<head><title>x</title><style>h1 {}</style></head>\n"
            "<h1>Internal Server Error</h1>\n<pre>Traceback...</pre>\n</html>")
    error = http_error("/v1/models", 500, "Internal Server Error", page)
    assert str(error) == "the server answered HTTP 500 for /v1/models: Internal Server Error (an HTML page)"
    with FakeServer(models_status=502, models_body="<html><body><h1>Bad &amp; Gateway</h1></body></html>") as fake:
        with pytest.raises(RemoteError, match=r"^the server answered HTTP 502 for /v1/models: Bad & Gateway "
                                              r"\(an HTML page\)$"):
            connect(fake)


def test_an_answer_that_is_not_streamed_is_read_as_one_chunk():
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there"},
                          "finish_reason": "stop"}], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
    with FakeServer(whole_answer=whole, vllm=False) as fake:
        events = list(connect(fake).generate(ASK))
    assert isinstance(events[-1], Finished) and events[-1].text == "Hi there" and events[-1].reason == "eos"
    assert isinstance(events[0], Started) and events[0].prompt_tokens == 7


def test_closing_a_stream_from_another_thread_while_it_is_read_ends_it_quietly():
    from specula.engine.remote.http import EventStream

    with FakeServer(steps=[["a"], ["b"], ["c"]], stall_after=1) as fake:
        server = Server(fake.url)
        for _ in range(25):
            stream = EventStream(server, "/chat/completions", {"stream": True})
            seen, failures = [], []
            first = threading.Event()

            def read():
                try:
                    for event in stream:
                        seen.append(event)
                        first.set()
                except BaseException as exc:  # noqa: BLE001 - any exception here is the bug
                    failures.append(exc)
                finally:
                    first.set()

            reader = threading.Thread(target=read)
            reader.start()
            first.wait(10)
            stream.close()
            reader.join(10)
            assert not reader.is_alive() and failures == [] and stream.closed
