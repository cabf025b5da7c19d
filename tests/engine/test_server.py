"""`specula serve`: OpenAI clients stream from it, every token's origin comes with it, /metrics counts
what the stream said, errors have OpenAI's shape and status, a client that leaves cancels its request,
and the control endpoints load, list and cancel. A real uvicorn server on a free loopback port, over a
tiny random Llama with the bundled tokenizer (a 128-token window)."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from specula.engine.api.events import Origin, Step, Token
from specula.engine.api.prompts import Message
from specula.engine.api.types import DecodeConfig, GenerateRequest, LoadRequest, ModelChoice
from specula.engine.remote.telemetry import parse_metrics
from specula.engine.serving.session import Session

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from specula.engine.cli.serve import is_loopback  # noqa: E402
from specula.engine.serving.replies import TextStream  # noqa: E402
from tests.support.engines import ServerThread  # noqa: E402


class Served:
    """`specula serve`'s app on a free port, in a thread."""

    def __init__(self, folder, api_key: str | None = None, **options) -> None:
        """`options`: create_app's (max_queue, max_body, allow_servers, ...)."""
        from specula.engine.serving.routes import create_app
        from specula.engine.serving.service import EngineService

        self.service = EngineService()
        initial = LoadRequest(ModelChoice(str(folder), "cpu", "fp32"), measure_baseline=False)
        self.server = ServerThread(lambda port: create_app(self.service, model_aliases=("tiny",), strategy="none",
                                                           api_key=api_key, initial=initial, port=port, **options))
        self.port, self.url = self.server.port, self.server.url
        deadline = time.time() + 120
        while self.get("/health")[0] != 200:
            assert time.time() < deadline, "the server never became ready"
            time.sleep(0.1)

    def request(self, method: str, path: str, body: dict | bytes | None = None, headers: dict | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, data, {"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read().decode()

    def get(self, path: str, headers: dict | None = None):
        try:
            return self.request("GET", path, headers=headers)
        except OSError:
            return 0, ""

    def post(self, path: str, body, headers: dict | None = None) -> tuple[int, dict]:
        status, text = self.request("POST", path, body, headers)
        return status, json.loads(text)

    def events(self, path: str, body: dict) -> list[dict]:
        status, text = self.request("POST", path, body)
        assert status == 200, text
        out = []
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(json.loads(line[6:]))
        return out

    def client(self, key: str = "unused"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    def close(self) -> None:
        self.server.stop()
        self.server.done.wait(10)


@pytest.fixture(scope="module")
def served(tiny_folder):
    s = Served(tiny_folder)
    yield s
    s.close()


@pytest.fixture(scope="module")
def session(tiny_folder):
    session = Session()
    session.load(LoadRequest(ModelChoice(str(tiny_folder), "cpu", "fp32"), measure_baseline=False))
    return session


HELLO = [{"role": "user", "content": "Write a short story about a cat and a dog."}]


def local_answer(session: Session, messages, n: int, strategy: str = "none") -> str:
    request = GenerateRequest(tuple(Message(m["role"], m["content"]) for m in messages), strategy,
                              DecodeConfig(max_new_tokens=n))
    return [e for e in session.generate(request)][-1].text


def ext(chunk) -> dict:
    return (chunk.model_extra or {}).get("specula") or {}


def test_an_openai_client_streams_the_engines_own_answer_with_every_tokens_origin(served, session):
    expected = local_answer(session, HELLO, 40)
    client = served.client()
    for strategy in ("none", "prompt-lookup"):
        stream = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=40, temperature=0, stream=True,
                                                stream_options={"include_usage": True},
                                                extra_body={"specula": {"strategy": strategy, "k": 3}})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == expected, strategy  # lossless through the server
        assert ext(chunks[0])["strategy"] == strategy
        tokens = [t for c in chunks for t in ext(c).get("tokens", [])]
        assert "".join(t["text"] for t in tokens) == text  # the extension accounts for every character
        assert {t["origin"] for t in tokens} <= {o.value for o in Origin}
        for c in chunks:  # each chunk's tokens are exactly its text
            if c.choices and ext(c).get("tokens"):
                assert "".join(t["text"] for t in ext(c)["tokens"]) == (c.choices[0].delta.content or "")
        steps = [ext(c) for c in chunks if "step" in ext(c)]
        assert steps[0]["step"] == 0 and all(s["verify_s"] >= 0 for s in steps)
        if strategy == "prompt-lookup":
            assert sum(s["drafted"] for s in steps) > 0
            assert all(t["origin"] != "target" for s in steps[1:] if s["drafted"] for t in s["tokens"])
        assert chunks[-1].usage.completion_tokens == 40
        assert chunks[-2].choices[0].finish_reason == "length"
    whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=40, temperature=0)
    assert whole.choices[0].message.content == expected
    assert whole.usage.completion_tokens == 40 and whole.usage.prompt_tokens > 0


def test_completions_take_a_raw_prompt(served, session):
    request = GenerateRequest((Message("user", "Once upon a time"),), config=DecodeConfig(max_new_tokens=10), chat=False)
    expected = [e for e in session.generate(request)][-1].text
    result = served.client().completions.create(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0)
    assert result.choices[0].text == expected
    chunks = list(served.client().completions.create(model="tiny", prompt="Once upon a time", max_tokens=10,
                                                     temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected


def test_metrics_count_what_the_stream_said(served):
    before = parse_metrics(served.get("/metrics")[1])
    events = served.events("/v1/chat/completions", {"messages": HELLO, "max_tokens": 30, "temperature": 0,
                                                    "stream": True, "specula": {"strategy": "prompt-lookup", "k": 4}})
    steps = [e["specula"] for e in events if "step" in e.get("specula", {})]
    after = parse_metrics(served.get("/metrics")[1])
    delta = after - before
    drafted = [s for s in steps if s["step"] > 0 and s["drafted"]]
    assert delta.drafts == len(drafted)
    assert delta.draft_tokens == sum(s["drafted"] for s in drafted)
    assert delta.accepted == sum(s["accepted"] for s in drafted)
    page = served.get("/metrics")[1]
    assert "vllm:num_requests_waiting" in page and "specula_tokens_total" in page and 'origin="target"' in page
    # the live speedup, as the stream's last chunk gave it: plain time / spent time, summed over requests
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
              if line.startswith("specula_speedup_") or line.startswith("specula_plain_tokens")}
    last = events[-1]["specula"]["totals"]
    assert values["specula_speedup_spent_seconds_total"] >= last["wall_s"] - last["prefill_s"] > 0
    assert values["specula_speedup_plain_seconds_total"] > 0 and values["specula_plain_tokens_per_second"] > 0
    assert last["speedup"] > 0


@pytest.mark.parametrize("body, status, words", [
    ({"model": "gpt-4", "messages": HELLO}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": "word " * 400}], "max_tokens": 4}, 400, "context window"),
    ({"messages": HELLO, "specula": {"strategy": "none", "colour": 1}}, 400, "unknown field 'colour'"),
    ({"messages": HELLO, "specula": {"strategy": "eagle"}}, 400, "cannot use 'eagle'"),
    ({"messages": HELLO, "n": 2}, 400, "'n' must be 1"),
    ({"messages": HELLO, "temperature": -1}, 400, "'temperature' must be >= 0"),
    ({"messages": HELLO, "max_tokens": 0}, 400, "'max_tokens' must be >= 1"),
    ({"messages": HELLO, "surprise": True}, 400, "unknown field 'surprise'"),
    ({"messages": []}, 400, "'messages'"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "role"),
])
def test_bad_requests_get_openai_errors_with_the_right_status(served, body, status, words):
    got, reply = served.post("/v1/chat/completions", body)
    assert got == status, reply
    assert words in reply["error"]["message"]
    assert set(reply["error"]) == {"message", "type", "param", "code"}


def test_auto_with_and_without_the_models_own_phrases_answers_as_plain_decoding(served, session):
    expected = local_answer(session, HELLO, 30)
    for phrases in (True, False):
        whole = served.client().chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=30, temperature=0,
            extra_body={"specula": {"strategy": "auto", "options": {"phrases": phrases}}})
        assert whole.choices[0].message.content == expected, phrases
    got, reply = served.post("/v1/chat/completions",
                             {"messages": HELLO, "specula": {"strategy": "auto", "options": {"phrases": "x"}}})
    assert got == 400 and "phrases" in reply["error"]["message"], reply


def test_a_body_that_is_not_json_is_a_400(served):
    status, text = served.request("POST", "/v1/chat/completions", b"{not json")
    assert status == 400 and "not valid JSON" in text


def test_a_number_too_long_for_python_is_a_400_not_a_500(served):
    body = b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "seed": ' + b"9" * 5000 + b"}"
    status, text = served.request("POST", "/v1/chat/completions", body)
    assert status == 400 and "more than 4,300 digits" in text, text
    status, text = served.request("POST", "/specula/v1/train", b'{"tokens": ' + b"7" * 5000 + b"}")
    assert status == 400 and "digits" in text, text


@pytest.mark.parametrize("body, where", [
    (rb'{"messages": [{"role": "user", "content": "a\ud800b"}], "max_tokens": 4}', "messages[0].content"),
    (rb'{"model": "\ud800", "messages": [{"role": "user", "content": "Hi"}]}', "model"),
    (rb'{"messages": [{"role": "user", "content": "Hi", "\udfff": 1}]}', "the key 'messages[0].\\udfff'"),
    (rb'{"a\ud800": 1, "messages": [{"role": "user", "content": "Hi"}]}', "the key 'a\\ud800'"),
    (rb'"\udc00"', "the body holds"),
])
def test_a_lone_surrogate_anywhere_in_a_body_is_a_400_naming_where(served, body, where):
    status, text = served.request("POST", "/v1/chat/completions", body)
    assert status == 400, text
    reply = json.loads(text)
    assert where in reply["error"]["message"] and "surrogate" in reply["error"]["message"]
    text.encode("utf-8")  # the answer itself is text
    ok = rb'{"messages": [{"role": "user", "content": "\ud83d\ude00"}], "max_tokens": 2}'  # a pair: one emoji
    assert served.request("POST", "/v1/chat/completions", ok)[0] == 200


def test_a_stop_sequence_ends_the_answer_before_it(served, session):
    """...and its extension says "stop" (as docs/SERVER.md and /metrics do; the engine saw a cancel)."""
    full = local_answer(session, HELLO, 30)
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop and stop in full
    cut = full[: full.index(stop)]
    whole = served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=30, temperature=0, stop=[stop])
    assert whole.choices[0].message.content == cut and whole.choices[0].finish_reason == "stop"
    assert whole.model_extra["specula"]["reason"] == "stop"
    chunks = list(served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=30, temperature=0,
                                                         stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut
    assert "".join(t["text"] for c in chunks for t in ext(c).get("tokens", [])) == cut
    assert ext(chunks[-1])["reason"] == "stop" and chunks[-1].choices[0].finish_reason == "stop"


def test_a_one_token_answer_reports_its_token_over_its_time_and_no_tokens_per_step(served):
    """Its token came with the prompt's pass: no time after it for a rate after the first token (it said 0.0
    tokens/s); the one token over its time instead, and no tokens per step (a pass that only ended it read 0.50)."""
    from specula.engine.api.events import Totals, tokens_per_step

    chunks = list(served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=1, temperature=0,
                                                         stream=True))
    totals = ext(chunks[-1])["totals"]
    assert totals["new_tokens"] == 1 and totals["wall_s"] > 0
    assert totals["tokens_per_s"] == pytest.approx(1 / totals["wall_s"])
    one = Totals(1, 1, 2, 3, 0, 0.5, 0.4, 0.01, 0.09)  # a drafted step that ended it at its end token
    assert one.tokens_per_s == pytest.approx(2.0) and tokens_per_step(one) is None
    assert tokens_per_step(Totals(5, 2, 3, 6, 3, 0.5, 0.1, 0.1, 0.3)) == pytest.approx(5 / 3)


def test_a_stop_sequence_counts_the_tokens_generated_up_to_the_one_that_completes_it(served, session):
    """A stop sequence matched at the very start leaves no text, yet the answer took its first token: usage counts
    the tokens generated to the one that completes the stop sequence, those it cut included (as OpenAI and vLLM do)."""
    request = GenerateRequest(tuple(Message(m["role"], m["content"]) for m in HELLO), "none", DecodeConfig(max_new_tokens=8))
    first = next(t.text for e in session.generate(request) if isinstance(e, Step) for t in e.tokens)
    assert first.strip()
    for stream in (False, True):
        answer = served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, temperature=0,
                                                         stop=[first.strip()[:1]], stream=stream,
                                                         **({"stream_options": {"include_usage": True}} if stream else {}))
        chunks = list(answer) if stream else [answer]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) if stream else \
            answer.choices[0].message.content
        assert text == first[:first.index(first.strip()[:1])] and chunks[-1].usage.completion_tokens == 1


def test_a_client_that_leaves_cancels_its_request_and_the_next_one_is_served(served):
    def cancelled() -> float:
        for line in served.get("/metrics")[1].splitlines():
            if line.startswith("vllm:request_success_total") and 'finished_reason="cancelled"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = cancelled()
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    body = {"messages": HELLO, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    response.fp.readline()  # the first chunk
    conn.sock.close()
    conn.close()
    deadline = time.time() + 30
    while cancelled() == before:
        assert time.time() < deadline, "the request was not cancelled"
        time.sleep(0.05)
    reply = served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, temperature=0)
    assert reply.choices[0].finish_reason == "length"


def test_requests_are_served_one_at_a_time_in_arrival_order(served):
    finished: list[int] = []

    def ask(i: int) -> None:
        served.client().chat.completions.create(model="tiny", messages=HELLO, max_tokens=20 + i, temperature=0)
        finished.append(i)

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=ask, args=(i,)))
        threads[-1].start()
        time.sleep(0.3)
    for t in threads:
        t.join(60)
    assert finished == [0, 1, 2]


def test_the_control_endpoints_list_load_and_cancel(served, tiny_folder):
    status, text = served.get("/specula/v1/strategies")
    rows = {r["name"]: r for r in json.loads(text)["strategies"]}
    assert status == 200 and rows["prompt-lookup"]["available"] and not rows["eagle"]["available"]
    assert rows["eagle"]["needs"] == "a trained eagle head"
    events = served.events("/specula/v1/load", {"model": str(tiny_folder), "device": "cpu", "dtype": "fp32",
                                                 "measure_baseline": False})
    assert events[0]["type"] == "queued" and events[1]["type"] == "progress" and events[-1]["type"] == "loaded"
    assert events[-1]["model"]["context_window"] == 128
    status, bad = served.post("/specula/v1/load", {"model": str(tiny_folder / "missing")})  # refused before queued
    assert status == 404 and bad["error"]["code"] == "model_not_found" and "missing" in bad["error"]["message"]
    now = json.loads(served.get("/specula/v1/status")[1])
    assert now["state"] == "ready"  # the last good model stays
    assert now["step"] == "eager"  # SPECULA_STEP=eager for the tests
    assert served.post("/specula/v1/requests/99999/cancel", {})[0] == 404


def test_the_remote_backend_reads_a_specula_servers_own_events(served, session):
    from specula.engine.api.types import RemoteLoadRequest
    from specula.engine.remote.backend import RemoteBackend

    backend = RemoteBackend()
    loaded = backend.load(RemoteLoadRequest(served.url, use_keyring=False))
    assert loaded.context_window == 128 and backend.info.kind == "specula"  # exact events, not inferred ones
    can = loaded.capabilities  # declared: the window asks these, never the backend's name
    assert can.exact_colours and can.acceptance == "steps" and not can.strategies and not can.training
    request = GenerateRequest(tuple(Message(**m) for m in HELLO), config=DecodeConfig(max_new_tokens=16))
    events = list(backend.generate(request))
    assert events[-1].text == local_answer(session, HELLO, 16)


def test_an_api_key_is_required_when_set(tiny_folder):
    s = Served(tiny_folder, api_key="sesame")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.client("sesame").models.list().data[0].id
        assert s.get("/metrics")[0] == 401 and s.get("/health")[0] == 200
    finally:
        s.close()


def test_serve_refuses_another_address_without_a_key():
    from specula.engine.cli.main import main

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert is_loopback("LOCALHOST") and is_loopback("localhost.") and is_loopback("ip6-localhost")
    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2


def test_serve_prints_a_model_that_did_not_load_to_its_terminal(tmp_path):
    """The server stays up (a load request may bring another model), and says on its terminal, in one line, why the
    model it was started with did not load."""
    import os
    import subprocess
    import sys

    from tests.support.gguf_files import tiny_llama, write_gguf

    whole = write_gguf(tmp_path / "whole.gguf", tiny_llama(seed=2, layers=1), "Q8_0").read_bytes()
    half = tmp_path / "half.gguf"
    half.write_bytes(whole[:len(whole) // 2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    server = subprocess.Popen([sys.executable, "-m", "specula.engine.cli", "serve", "--model", str(half), "--port", "0",
                               "--no-baseline"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(server.stderr), daemon=True)  # until the server ends
    reader.start()
    try:
        deadline = time.time() + 120
        while not any(line.startswith("specula serve: the load failed") for line in lines):
            assert time.time() < deadline and server.poll() is None, "".join(lines)
            time.sleep(0.1)
        failed = next(line for line in lines if line.startswith("specula serve: the load failed"))
        assert "half.gguf" in failed and "truncated" in failed and server.poll() is None
    finally:
        server.kill()
        server.wait(60)


def _tokens(*texts: str) -> tuple[Token, ...]:
    return tuple(Token(i, t, Origin.TARGET, i) for i, t in enumerate(texts))


def test_text_stream_holds_back_what_may_begin_a_stop_sequence_and_cuts_tokens_at_it():
    stream = TextStream(("END",))
    assert stream.push(_tokens("hello ", "E")) == ("hello", [])  # " E" may begin "END"; "hello " is not all out
    piece, tokens = stream.push(_tokens("N", "D and more"))
    assert stream.stopped and stream.text == "hello "
    assert piece == " " and [t.text for t in tokens] == ["hello "]
    plain = TextStream()
    assert plain.push(_tokens("a", "b"))[0] == "ab"
    assert plain.finish("abc") == ("c", [])
    cut = TextStream(("x",))
    piece, tokens = cut.push(_tokens("ab", "cxd"))
    assert piece == "abc" and [t.text for t in tokens] == ["ab", "c"]
    assert stream.generated == 4 and plain.generated == 2 and cut.generated == 2
    first = TextStream(("END",))  # matched at the start, its tokens after it in the same step not counted
    assert first.push(_tokens("EN", "D", "more")) == ("", []) and first.stopped and first.generated == 2


def test_the_client_reads_a_server_without_a_model_as_starting():
    from specula.engine.remote.client import EngineClient
    from specula.engine.serving.routes import create_app
    from specula.engine.serving.service import EngineService

    empty = ServerThread(create_app(EngineService(), strategy="none"))
    try:
        health = EngineClient(empty.url).health()
        assert health["status"] == "starting" and "503" in health["message"]
        assert EngineClient("http://127.0.0.1:9").health()["status"] == "unreachable"  # nothing listens there
    finally:
        empty.stop()


def test_loaded_events_carry_their_capabilities_over_the_wire():
    from specula.engine.api.events import REMOTE, Capabilities, Loaded
    from specula.engine.api.wire import loaded_from, loaded_json

    for can in (Capabilities(), REMOTE):
        event = Loaded(3, "m", None, "cpu", "bf16", 128, ("none",), capabilities=can)
        data = json.loads(json.dumps(loaded_json(event)))
        assert loaded_from(data, 3) == event
    data = loaded_json(Loaded(3, "m", None, "cpu", "bf16", 128))
    data["capabilities"]["from_a_newer_server"] = True  # a field this client does not know is left out
    assert loaded_from(data, 3).capabilities == Capabilities()

