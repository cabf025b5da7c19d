"""`specula serve` left running: no web page can drive it, no request can read the server's environment
or relay a server the operator did not allow, work is bounded (body size, queue, slow headers and
bodies, clients that leave), and OpenAI's contract holds where a client would notice. A real uvicorn
server on a loopback port over the tiny random Llama (a 128-token window)."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import sys
import threading
import time
import weakref

import pytest

from specula.engine.api.events import Finished
from specula.engine.serving import guard

pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from tests.engine.test_server import HELLO, Served  # noqa: E402
from tests.support.fake_server import FakeServer  # noqa: E402


@pytest.fixture(scope="module")
def served(tiny_folder):
    s = Served(tiny_folder)
    yield s
    s.close()


def raw(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, parsed JSON or text) of one request with exactly these headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request(method, path, body, headers or {})
    response = conn.getresponse()
    text = response.read().decode()
    try:
        data = json.loads(text)
    except ValueError:
        data = text
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


def sse(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def metric(served, name: str, label: str = "") -> float:
    for line in served.get("/metrics")[1].splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


LOAD = json.dumps({"model": "bundled"}).encode()


# ---- no web page can drive it --------------------------------------------------------------------------


def test_a_browsers_cross_site_requests_are_refused_on_every_route(served):
    foreign = {"Origin": "http://evil.example", "Content-Type": "application/json"}
    for method, path, body in (("POST", "/specula/v1/load", LOAD), ("POST", "/v1/chat/completions", b"{}"),
                               ("GET", "/specula/v1/status", None), ("GET", "/metrics", None),
                               ("POST", "/specula/v1/requests/1/cancel", None)):
        status, _, data = raw(served.port, method, path, body, foreign)
        assert status == 403 and data["error"]["code"] == "origin_not_allowed", path
    for origin in ("null", "file://", "http://127.0.0.1:1"):  # sandboxed frames, files, another port
        assert raw(served.port, "GET", "/v1/models", None, {"Origin": origin})[0] == 403, origin
    # a "simple" request a page may send without asking first: text/plain, even from no page at all
    status, _, data = raw(served.port, "POST", "/specula/v1/load", LOAD, {"Content-Type": "text/plain"})
    assert status == 415 and "application/json" in data["error"]["message"]
    status, _, _ = raw(served.port, "POST", "/specula/v1/train", b"kind=eagle",
                       {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415
    assert served.get("/specula/v1/status")[0] == 200  # the state did not change: still serving
    same = {"Origin": f"http://127.0.0.1:{served.port}"}  # the server's own origin passes
    assert raw(served.port, "GET", "/v1/models", None, same)[0] == 200


def test_a_keyless_server_answers_only_requests_addressed_to_a_loopback_name(served):
    for host in ("evil.example", f"evil.example:{served.port}", f"127.0.0.1.evil.example:{served.port}",
                 "192.168.1.2", f"localhost:{served.port + 1}", "", "[::1"):
        status, _, data = raw(served.port, "GET", "/v1/models", None, {"Host": host})
        assert status in (400, 403), host  # 400: uvicorn's own answer to an empty or broken Host
        if status == 403:
            assert data["error"]["code"] == "host_not_allowed"
    for host in (f"127.0.0.1:{served.port}", f"localhost:{served.port}", f"[::1]:{served.port}", "localhost"):
        assert raw(served.port, "GET", "/v1/models", None, {"Host": host})[0] == 200, host


def test_with_a_key_any_host_may_be_used_but_web_pages_are_still_refused(tiny_folder):
    s = Served(tiny_folder, api_key="sesame")
    try:
        key = {"Authorization": "Bearer sesame"}
        assert raw(s.port, "GET", "/v1/models", None, {"Host": "specula.lan:443", **key})[0] == 200  # a proxy's name
        assert raw(s.port, "GET", "/v1/models", None, {"Host": "specula.lan:443"})[0] == 401
        assert raw(s.port, "GET", "/v1/models", None, {"Origin": "http://evil.example", **key})[0] == 403
    finally:
        s.close()


# ---- no request reads the server's environment or relays a server the operator did not allow -----------


def test_a_request_cannot_make_the_server_send_an_environment_variable_anywhere(tiny_folder, monkeypatch):
    monkeypatch.setenv("SPECULA_TEST_SECRET", "the-secret")
    with FakeServer() as fake:
        for key in (None, "sesame"):
            s = Served(tiny_folder, api_key=key, allow_servers=(fake.url,))
            try:
                auth = {"Authorization": "Bearer sesame"} if key else {}
                body = {"server": {"url": fake.url, "api_key_env": "SPECULA_TEST_SECRET"}}
                status, data = s.post("/specula/v1/load", body, auth)
                assert status == 403 and data["error"]["param"] == "server.api_key_env", key
                assert "the-secret" not in json.dumps(data)
            finally:
                s.close()
        assert fake.requests == [] and not any("the-secret" in json.dumps(r) for r in fake.requests)


def test_a_keyless_server_relays_only_the_servers_it_was_started_with(tiny_folder):
    with FakeServer(api_key="their-key") as allowed, FakeServer() as other:
        s = Served(tiny_folder, allow_servers=(allowed.url + "/v1",))
        try:
            status, data = s.post("/specula/v1/load", {"server": {"url": other.url}})
            assert status == 403 and data["error"]["param"] == "server.url"
            status, data = s.post("/specula/v1/load", {"server": {"url": allowed.url, "baseline_url": other.url}})
            assert status == 403 and data["error"]["param"] == "server.baseline_url"
            # the caller's own key for the allowed server travels to that server only
            events = s.events("/specula/v1/load", {"server": {"url": allowed.url, "api_key": "their-key"}})
            assert events[-1]["type"] == "loaded", events
            assert s.get("/specula/v1/status")[1].count("fake-model")
        finally:
            s.close()


def test_the_engine_client_sends_a_relayed_servers_key_itself_never_the_variables_name(monkeypatch):
    from specula.engine.api.types import RemoteLoadRequest
    from specula.engine.remote.client import load_payload

    monkeypatch.setenv("SPECULA_TEST_KEY", "k-123")
    payload = load_payload(RemoteLoadRequest("http://10.0.0.5:8000", api_key_env="SPECULA_TEST_KEY", use_keyring=False))
    assert payload["server"]["api_key"] == "k-123" and "api_key_env" not in payload["server"]
    assert "api_key" not in load_payload(RemoteLoadRequest("http://10.0.0.5:8000", use_keyring=False))["server"]
    assert "k-123" not in repr(RemoteLoadRequest("http://x", api_key="k-123"))  # never in a log line


# ---- bounded work --------------------------------------------------------------------------------------


def test_bodies_beyond_the_limit_are_refused_before_they_are_read(tiny_folder):
    s = Served(tiny_folder, max_body=2000)
    try:
        big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()
        status, headers, data = raw(s.port, "POST", "/v1/chat/completions", big, {"Content-Type": "application/json"})
        assert status == 413 and data["error"]["code"] == "body_too_large"
        # sent in chunks, without a length: counted as it comes
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", iter([big[:1000], big[1000:]]),
                     {"Content-Type": "application/json"}, encode_chunked=True)
        assert conn.getresponse().status == 413
        small = {"messages": HELLO, "max_tokens": 4, "temperature": 0}
        assert s.post("/v1/chat/completions", small)[0] == 200
    finally:
        s.close()


def test_a_client_that_sends_a_too_large_body_whole_reads_the_413_not_a_reset(tiny_folder):
    """Most clients send the whole body before they read the answer: the server reads the rest of a refused body
    (dropping it) before it answers, so the client reads the 413; one that waits for "100 Continue" is answered
    at once, before it sends anything."""
    s = Served(tiny_folder, max_body=1 << 20)
    try:
        big = b'{"messages": "' + b"x" * (12 << 20) + b'"}'
        for chunked in (False, True):
            conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
            body = iter([big[i:i + (1 << 20)] for i in range(0, len(big), 1 << 20)]) if chunked else big
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"},
                         encode_chunked=chunked)
            response = conn.getresponse()
            assert response.status == 413 and json.loads(response.read())["error"]["code"] == "body_too_large"
        with socket.create_connection(("127.0.0.1", s.port), timeout=60) as waiting:
            waiting.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                            b"\r\nExpect: 100-continue\r\nContent-Length: " + str(len(big)).encode() + b"\r\n\r\n")
            assert waiting.recv(4096).startswith(b"HTTP/1.1 413")
        assert s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})[0] == 200
    finally:
        s.close()


class Gate:
    """The engine's generation held after its start (Started) until `open` is set (the requests behind it wait in the
    queue), or, with `pace`, every event held back `pace` seconds (events come faster than a client
    could be polled for)."""

    def __init__(self, service, pace: float | None = None) -> None:
        self.open, self.entered = threading.Event(), threading.Event()
        session = service.worker.session
        original = session.generate

        def generate(request, rid=0, cancelled=lambda: False):
            events = original(request, rid, cancelled)
            yield next(events)  # Started: the request runs
            self.entered.set()
            if pace is None:
                assert self.open.wait(120), "the test never opened the gate"
            for event in events:
                if pace is not None:
                    time.sleep(pace)
                yield event

        session.generate = generate


def test_a_full_queue_answers_429_with_retry_after_and_loses_nothing(tiny_folder):
    s = Served(tiny_folder, max_queue=2)
    gate = Gate(s.service)
    answers: dict[int, tuple] = {}
    body = {"messages": HELLO, "max_tokens": 8, "temperature": 0}

    def ask(i: int) -> None:
        answers[i] = s.post("/v1/chat/completions", body)

    try:
        threads = [threading.Thread(target=ask, args=(0,))]
        threads[0].start()
        assert gate.entered.wait(60)  # the first one runs (held at its start)
        for i in (1, 2):
            threads.append(threading.Thread(target=ask, args=(i,)))
            threads[-1].start()
        deadline = time.time() + 60
        while s.service.queue_depth < 2:
            assert time.time() < deadline, "the two requests never queued"
            time.sleep(0.02)
        status, headers, data = raw(s.port, "POST", "/v1/chat/completions", json.dumps(body).encode(),
                                    {"Content-Type": "application/json"})
        assert status == 429 and data["error"]["code"] == "queue_full"
        assert 1 <= int(headers["retry-after"]) <= 60
        gate.open.set()
        for t in threads:
            t.join(120)
        assert [answers[i][0] for i in range(3)] == [200, 200, 200], answers
        texts = {answers[i][1]["choices"][0]["message"]["content"] for i in range(3)}
        assert [answers[i][0] for i in range(3)] == [200, 200, 200] and len(texts) == 1  # the same prompt, greedy
    finally:
        gate.open.set()
        s.close()


def test_a_client_that_leaves_a_non_streamed_request_cancels_it_before_the_next_steps(tiny_folder):
    s = Served(tiny_folder)
    Gate(s.service, pace=0.1)  # a step every 0.1 s: the answer would take about 10 s to the window's end
    try:
        before = metric(s, "vllm:request_success_total", 'finished_reason="cancelled"')
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
        body = json.dumps({"messages": HELLO, "temperature": 0}).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.time() + 60
        while s.service.running is None:
            assert time.time() < deadline, "the request never started"
            time.sleep(0.02)
        time.sleep(0.3)  # a few steps in
        sock.close()
        while metric(s, "vllm:request_success_total", 'finished_reason="cancelled"') < before + 1:
            assert time.time() < deadline, "the request of a client that left was not cancelled"
            time.sleep(0.05)
        assert metric(s, "vllm:request_success_total", 'finished_reason="length"') == 0  # it did not run to the end
        assert s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2})[0] == 200  # the next one is served
    finally:
        s.close()


def test_slow_headers_and_bodies_are_cut_off(served, monkeypatch):
    monkeypatch.setattr(guard, "BODY_IDLE_S", 0.5)
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"mess")
    answer = b""
    while chunk := sock.recv(4096):  # the whole answer: the server closes the connection after it
        answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 408") and "request_timeout" in answer
    sock.close()
    monkeypatch.setattr(guard.Protocol, "header_timeout_s", 0.5)
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=60)
    sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # the head never ends
    assert sock.recv(4096) == b""  # closed by the server (a socket timeout would raise instead)
    sock.close()


def test_a_client_that_drops_a_half_sent_body_leaves_no_traceback(served, caplog):
    with caplog.at_level(logging.WARNING):
        sock = socket.create_connection(("127.0.0.1", served.port), timeout=60)
        sock.sendall(b"POST /specula/v1/load HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\"")
        time.sleep(0.2)
        sock.close()
        time.sleep(0.5)
        assert served.get("/health")[0] == 200
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


# ---- OpenAI's contract ---------------------------------------------------------------------------------


def test_bad_bodies_get_400_with_a_json_error_and_a_short_echo(served, caplog):
    with caplog.at_level(logging.WARNING):
        deep = ("[" * 100000 + "]" * 100000).encode()
        status, _, data = raw(served.port, "POST", "/v1/chat/completions", deep, {"Content-Type": "application/json"})
        assert status == 400 and data["error"]["type"] == "invalid_request_error"
        status, data = served.post("/v1/chat/completions", {"messages": HELLO, "seed": 1 << 70})
        assert status == 400 and data["error"]["param"] == "seed"
        status, data = served.post("/v1/chat/completions", {"messages": HELLO, "model": "m" * 100000})
        assert status == 404 and len(data["error"]["message"]) < 300
        status, data = served.post("/v1/chat/completions", {"messages": HELLO, "x" * 100000: 1})
        assert status == 400 and len(data["error"]["message"]) < 300
        status, data = served.post("/v1/chat/completions", {"messages": HELLO, "seed": 1 << 64})
        assert status == 400 and "18446744073709551615" in data["error"]["message"]  # not 1.84467e+19
        status, data = served.post("/v1/chat/completions", {"messages": HELLO, "stream_options": {"include_usage": True}})
        assert status == 400 and data["error"]["param"] == "stream_options"  # as OpenAI and vLLM: only with stream
        status, _, data = raw(served.port, "GET", "/" + "p" * 20000)
        assert status == 404 and len(data["error"]["message"]) < 300  # a 20 KB path is not echoed whole
        status, _, data = raw(served.port, "POST", "/specula/v1/requests/" + "9" * 4000 + "/cancel", b"{}",
                              {"Content-Type": "application/json"})
        assert status == 400 and len(data["error"]["message"]) < 300
    assert not [r for r in caplog.records if r.exc_info]


def test_a_stop_sequence_is_counted_as_stop_and_clients_gone_from_the_queue_leave_it(tiny_folder):
    """/metrics counts an answer a stop sequence ended as "stop" (vLLM's reason; the engine saw a cancel), and a
    client that leaves while queued no longer counts against --max-queue (it got 429 "requests are waiting")."""
    s = Served(tiny_folder, max_queue=1)
    try:
        first = s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 12, "temperature": 0})[1]
        text = first["choices"][0]["message"]["content"]
        assert len(text) > 3
        status, data = s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 12, "temperature": 0,
                                                       "stop": [text[2:4]]})
        assert status == 200 and data["choices"][0]["finish_reason"] == "stop"
        deadline = time.time() + 30
        while metric(s, "vllm:request_success_total", 'finished_reason="stop"') < 1:
            assert time.time() < deadline, s.get("/metrics")[1]
            time.sleep(0.05)
        assert metric(s, "vllm:request_success_total", 'finished_reason="cancelled"') == 0
        gate = Gate(s.service)
        body = json.dumps({"messages": HELLO, "max_tokens": 2}).encode()
        held = threading.Thread(target=lambda: s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2}))
        held.start()
        assert gate.entered.wait(60)
        leaving = socket.create_connection(("127.0.0.1", s.port), timeout=30)  # queued behind it, then gone
        leaving.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.time() + 60
        while s.service.queue_depth < 1:
            assert time.time() < deadline, "the request never queued"
            time.sleep(0.02)
        leaving.close()
        while s.service.queue_depth > 0:
            assert time.time() < deadline, "a client that left still counts as waiting"
            time.sleep(0.02)
        waiting = threading.Thread(target=lambda: s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2}))
        waiting.start()
        while s.service.queue_depth < 1:  # its place is free: queued, not refused
            assert time.time() < deadline and waiting.is_alive(), "the queue's place was not given back"
            time.sleep(0.02)
        gate.open.set()
        held.join(120)
        waiting.join(120)
    finally:
        s.close()


def test_a_load_of_a_model_that_is_not_there_is_a_4xx_with_an_error_body_not_an_event_under_200(served, tiny_folder,
                                                                                                 tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "empty").mkdir()
    for body, status, words in (({"model": str(tmp_path / "missing.gguf")}, 404, "missing.gguf"),
                                ({"model": str(tmp_path / "notes.txt")}, 404, "not a GGUF file"),
                                ({"model": str(tmp_path / "empty")}, 404, "no config.json"),
                                ({"model": str(tiny_folder), "draft": str(tmp_path / "gone")}, 404, "gone")):
        got, headers, data = raw(served.port, "POST", "/specula/v1/load", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
        assert got == status and headers["content-type"] == "application/json", (body, data)
        assert words in data["error"]["message"] and data["error"]["param"] == ("draft" if "draft" in body else "model")
    assert served.service.state == "ready"  # nothing was queued


def test_health_says_the_loaded_model_still_answers_after_a_failed_load(tiny_folder, tmp_path):
    from tests.support.gguf_files import tiny_llama, write_gguf

    unknown = write_gguf(tmp_path / "arch.gguf", tiny_llama(hidden=64, inter=128, layers=1), "Q8_0", arch="frobnicator")
    s = Served(tiny_folder)
    try:
        events = s.events("/specula/v1/load", {"model": str(unknown)})  # found, and refused as the engine reads it
        assert events[-1]["type"] == "error" and "frobnicator" in events[-1]["error"]["message"]
        deadline = time.time() + 60
        while s.service.state == "loading":
            assert time.time() < deadline
            time.sleep(0.05)
        status, _, data = raw(s.port, "GET", "/health")
        assert status == 200 and data["status"] == "ready" and data["step"] == s.service.worker.session.target.step_status
        assert data["message"].startswith("the last load failed (") and data["message"].endswith("still answers")
    finally:
        s.close()


def test_a_damaged_gguf_is_refused_as_the_requests_fault_and_the_working_model_keeps_answering(tiny_folder, tmp_path):
    from tests.support.gguf_files import damaged, data_offset, tiny_llama, write_gguf

    good = write_gguf(tmp_path / "good.gguf", tiny_llama(hidden=64, inter=128, layers=1), "Q8_0")
    bad = damaged(good, tmp_path / "bad.gguf", "blk.0.attn_q.weight", offset=data_offset(good, "blk.0.attn_q.weight") + 1)
    s = Served(tiny_folder)
    try:
        body = {"messages": HELLO, "max_tokens": 6, "temperature": 0}
        before = s.post("/v1/chat/completions", body)[1]["choices"][0]["message"]["content"]
        status, error = s.post("/specula/v1/load", {"model": str(bad)})  # its header says so: refused before queued
        assert status == 400 and error["error"]["type"] == "invalid_request_error" and error["error"]["param"] == "model"
        assert "blk.0.attn_q.weight" in error["error"]["message"] and "misaligned" in error["error"]["message"]
        assert s.service.state == "ready"
        status, data = s.post("/v1/chat/completions", body)
        assert status == 200 and data["choices"][0]["message"]["content"] == before
    finally:
        s.close()


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_reloading_a_model_gives_back_what_the_last_load_held(tiny_folder, tmp_path):
    """Each load lets the model before it go, and the memory it held goes back to the system: loading the same
    file again and again does not grow the process (it grew by most of a model each load, up to a plateau)."""
    from tests.support.gguf_files import tiny_llama, write_gguf

    path = write_gguf(tmp_path / "m.gguf", tiny_llama(seed=3), "Q8_0")
    s = Served(tiny_folder)
    try:
        def load() -> weakref.ref:
            assert s.events("/specula/v1/load", {"model": str(path)})[-1]["type"] == "loaded"
            return weakref.ref(s.service.worker.session.target.model)

        models, sizes = [load()], [_rss_mb()]
        for _ in range(4):
            models.append(load())
            sizes.append(_rss_mb())
        assert [m() is None for m in models] == [True] * 4 + [False]
        assert max(sizes) - sizes[0] < 40, sizes  # MB: about 90 without giving back
    finally:
        s.close()


class _Runs:
    """A pickled object that would run a command when unpickled: what a malicious pytorch_model.bin holds."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_a_model_folder_with_code_in_its_pickle_is_refused_without_torchs_advice_to_run_it(tiny_folder, tmp_path):
    """torch.load refuses it (weights only) and advises loading it anyway, which would run the file's code: neither
    the load's error nor /health passes that advice on, and nothing of the file runs."""
    import shutil

    import torch

    folder, marker = tmp_path / "evil", tmp_path / "ran"
    shutil.copytree(tiny_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({"model.embed_tokens.weight": torch.zeros(2), "payload": _Runs(marker)}, folder / "pytorch_model.bin")
    s = Served(tiny_folder)
    try:
        error = s.events("/specula/v1/load", {"model": str(folder)})[-1]
        assert error["type"] == "error", error
        message = error["error"]["message"]
        assert "Python objects besides tensors" in message and str(folder) in message, message
        deadline = time.time() + 60
        while s.service.state == "loading":
            assert time.time() < deadline
            time.sleep(0.05)
        health = raw(s.port, "GET", "/health")[2]
        for text in (message, health["message"]):
            assert "weights_only" not in text and "Re-running" not in text, text
        assert not marker.exists()
    finally:
        s.close()


def test_usage_comes_once_and_only_where_include_usage_asks(served):
    client = served.client()
    plain = list(client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, stream=True))
    assert all(c.usage is None for c in plain)
    asked = list(client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=6, stream=True,
                                                stream_options={"include_usage": True}))
    with_usage = [c for c in asked if c.usage is not None]
    assert len(with_usage) == 1 and with_usage[0] is asked[-1] and asked[-1].choices == []
    assert asked[-1].usage.completion_tokens == 6


def test_openais_fields_that_change_nothing_are_accepted(served):
    client = served.client()
    whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=4, temperature=0, store=False,
                                           metadata={"team": "a"}, user="u1", service_tier="auto",
                                           extra_body={"prompt_cache_key": "k", "safety_identifier": "s"})
    assert whole.choices[0].finish_reason == "length"
    status, data = served.post("/v1/chat/completions", {"messages": HELLO, "modalities": ["audio"]})
    assert status == 400 and data["error"]["param"] == "modalities"


def test_one_model_can_be_retrieved_by_its_name(served):
    client = served.client()
    listed = client.models.list().data[0]
    assert client.models.retrieve(listed.id).id == listed.id
    assert client.models.retrieve("tiny").id == listed.id  # the name it was started with
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("another/model")


def test_a_prompt_and_max_tokens_beyond_the_window_are_refused_as_vllm_does(served):
    client = served.client()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=126)
    assert refused.value.body["code"] == "context_length_exceeded" and "max_tokens" in refused.value.body["message"]
    without = client.chat.completions.create(model="tiny", messages=HELLO, temperature=0)  # the rest of the window
    assert without.choices[0].finish_reason in ("stop", "length")


def test_a_cancelled_answer_finishes_with_an_openai_reason_and_says_cancelled_in_the_extension(tiny_folder):
    s = Served(tiny_folder)
    Gate(s.service, pace=0.1)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps({"messages": HELLO, "stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        rid = response.getheader("X-Specula-Request-Id")
        assert s.post(f"/specula/v1/requests/{rid}/cancel", None)[0] == 200
        chunks = sse(response.read().decode())
        last = [c for c in chunks if c.get("choices")][-1]
        assert last["choices"][0]["finish_reason"] == "stop" and last["specula"]["reason"] == "cancelled"
    finally:
        s.close()


def test_serve_takes_the_new_limits_on_its_command_line():
    from specula.engine.cli.main import main

    assert main(["serve", "--no-model", "--port", "0", "--max-body-mb", "0"]) == 2
    assert main(["serve", "--no-model", "--port", "0", "--allow-key-env", "NOT A NAME"]) == 2


@pytest.mark.parametrize("key, words", [("clé-secrète-42", "other than visible ASCII"),
                                        ("two words here", "other than visible ASCII"), ("sesame", "has 6 characters")])
def test_serve_refuses_at_start_an_api_key_no_client_could_send(monkeypatch, capsys, key, words):
    """A header's bytes reach the server as Latin-1 text: a UTF-8 key could never match, so it is refused at start,
    in one line, as are keys with spaces and keys too short to hold off guessing."""
    from specula.engine.cli.main import main
    from specula.engine.cli.serve import api_key_from

    monkeypatch.setenv("SPECULA_TEST_KEY", key)
    assert main(["serve", "--no-model", "--port", "0", "--api-key-env", "SPECULA_TEST_KEY"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--api-key-env SPECULA_TEST_KEY" in err and words in err, err
    monkeypatch.setenv("SPECULA_TEST_KEY", "  sesame-open-42  ")
    assert api_key_from("SPECULA_TEST_KEY") == "sesame-open-42"


def test_a_cancelled_training_ends_with_a_cancelled_event_not_a_server_error(tiny_folder):
    s = Served(tiny_folder)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
        conn.request("POST", "/specula/v1/train", json.dumps({"kind": "eagle", "tokens": 100000, "epochs": 1}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        events, rid = [], None
        for line in iter(response.readline, b""):
            text = line.decode().strip()
            if not text.startswith("data: ") or text == "data: [DONE]":
                continue
            events.append(json.loads(text[6:]))
            if events[-1]["type"] == "queued":
                rid = events[-1]["request_id"]
            elif events[-1]["type"] == "progress" and rid is not None:
                assert s.post(f"/specula/v1/requests/{rid}/cancel", None)[0] == 200
                rid = None  # once
        last = events[-1]
        assert last["type"] == "error" and last["error"]["type"] == "cancelled" and last["error"]["code"] == "cancelled"
    finally:
        s.close()


def test_a_request_without_sampling_fields_gets_the_models_own_defaults_else_greedy(served):
    from transformers import GenerationConfig

    from specula.engine.serving.openai import model_sampling

    client = served.client()
    greedy = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=24, temperature=0)
    unset = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=24)  # the tiny model sets none
    assert unset.choices[0].message.content == greedy.choices[0].message.content
    config = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9, top_k=20)
    assert model_sampling(config) == (("temperature", 0.6), ("top_p", 0.9), ("top_k", 20))
    assert model_sampling(GenerationConfig(bos_token_id=1)) == () and model_sampling(None) == ()


def test_an_unknown_strategy_lists_only_what_the_loaded_model_can_use(served):
    status, data = served.post("/v1/chat/completions", {"messages": HELLO, "specula": {"strategy": "warp"}})
    assert status == 400 and "draft-model" not in data["error"]["message"] and "prompt-lookup" in data["error"]["message"]


def test_a_long_prompts_reading_is_streamed_as_progress(served, monkeypatch):
    from specula.engine.api.events import PromptProgress
    from specula.engine.api.types import GenerateRequest
    from specula.engine.decoding import loop
    from specula.engine.remote.client import EngineClient

    monkeypatch.setattr(loop, "PROMPT_CHUNK", 16)
    monkeypatch.setattr(loop, "PROGRESS_AFTER_S", 0.0)
    long = [{"role": "user", "content": "tell me about the cat and the dog " * 6}]
    chunks = list(served.client().chat.completions.create(model="tiny", messages=long, max_tokens=4, stream=True))
    progress = [c.model_extra["specula"]["prompt_progress"] for c in chunks
                if "prompt_progress" in (c.model_extra or {}).get("specula", {})]
    assert progress and all(p["done"] < p["total"] for p in progress) and not any(c.choices for c in chunks
                                                                                   if c.model_extra.get("specula", {}).get("prompt_progress"))
    from specula.engine.api.prompts import Message

    request = GenerateRequest((Message("user", long[0]["content"]),), "none")
    events = list(EngineClient(served.url).call(request, 1).events())
    assert any(isinstance(e, PromptProgress) for e in events) and isinstance(events[-1], Finished)


def test_a_flood_beyond_the_servers_most_gets_a_json_503(tiny_folder):
    s = Served(tiny_folder, max_active=1)
    gate = Gate(s.service)
    try:
        held = threading.Thread(target=lambda: s.post("/v1/chat/completions", {"messages": HELLO, "max_tokens": 2}))
        held.start()
        assert gate.entered.wait(60)  # one request being answered: the server's most
        status, headers, data = raw(s.port, "GET", "/v1/models")
        assert status == 503 and data["error"]["code"] == "server_busy" and headers["retry-after"]
        gate.open.set()
        held.join(60)
        assert raw(s.port, "GET", "/v1/models")[0] == 200
    finally:
        gate.open.set()
        s.close()


def test_clients_without_the_key_cannot_take_the_places_of_those_with_it(tiny_folder):
    """On a server with a key, requests without it are refused from their headers: before their bodies are read
    (here, bodies that never come) and before they count among the requests the server answers at once."""
    s = Served(tiny_folder, api_key="sesame", max_active=2)
    stalled = []
    try:
        for _ in range(6):  # each promises 4 MB and sends one byte: held for up to a minute if it were read
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 4000000\r\n\r\n{")
            stalled.append(sock)
        for sock in stalled:  # answered at once, from the headers
            head = sock.recv(4096).decode("latin-1")
            assert head.startswith("HTTP/1.1 401") and "connection: close" in head.lower(), head[:200]
        status, _, data = raw(s.port, "GET", "/v1/models", None, {"Authorization": "Bearer sesame"})
        assert status == 200 and data["data"]
        assert raw(s.port, "GET", "/health")[0] == 200  # open to all, as before
        status, _, data = raw(s.port, "POST", "/v1/chat/completions", b"{}",
                              {"Content-Type": "application/json", "Authorization": "Bearer wrong"})
        assert status == 401 and data["error"]["code"] == "invalid_api_key"
    finally:
        for sock in stalled:
            sock.close()
        s.close()
