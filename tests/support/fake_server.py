"""A scripted OpenAI-compatible server on a loopback port, speaking like vLLM (token ids, per-token
bytes, spec-decode counters), for tests of the remote backend that need exact control: HTTP errors,
malformed streams, a server that dies or stalls mid-answer. Tests against a real vLLM server are in
test_remote_vllm.py.

    with FakeServer(steps=[["Hel", "lo"], [" world"]]) as fake:
        fake.url                 # http://127.0.0.1:PORT
        fake.requests            # the JSON bodies received
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalServer:
    """An HTTP server on 127.0.0.1 at a free port, on a thread of its own, serving `handler`'s requests; use as
    a context manager (it stops on leaving)."""

    def __init__(self, handler) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakeServer(LocalServer):
    def __init__(self, steps=(("Hello",), (" there", "!")), *, model="fake-model", vllm=True, speculates=True,
                 delay_s=0.0, die_after=None, stall_after=None, status=None, error_body=None, malformed_after=None,
                 api_key=None, finish="stop", hold_headers=False, version="0.0-fake", raw_events=None,
                 whole_answer=None, models_status=None, models_body=None, metrics_extra="") -> None:
        self.steps = [list(s) for s in steps]  # each engine step: the texts of its tokens
        self.model, self.vllm, self.speculates = model, vllm, speculates
        self.delay_s, self.die_after, self.stall_after = delay_s, die_after, stall_after
        self.status, self.error_body, self.malformed_after = status, error_body, malformed_after
        self.api_key, self.finish, self.hold_headers = api_key, finish, hold_headers
        self.version, self.metrics_extra = version, metrics_extra
        self.raw_events = raw_events  # chunks streamed as they are, instead of `steps`
        self.whole_answer = whole_answer  # a JSON body answered instead of a stream
        self.models_status, self.models_body = models_status, models_body  # /v1/models failing with a page
        self.requests: list[dict] = []
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0, 0, 0, 0]}
        self.released = threading.Event()  # a stalled answer waits for this (or the client to go)
        self.answered = threading.Event()  # the server began its answer (sent its headers)
        super().__init__(_handler(self))

    def __exit__(self, *exc) -> None:
        self.released.set()
        super().__exit__(*exc)

    def book(self, n_tokens: int) -> None:
        """Count one engine step that emitted n tokens (the stop token included, as vLLM counts it): a
        4-token draft with n - 1 accepted."""
        c = self.counters
        c["drafts"] += 1
        c["draft_tokens"] += 4
        c["accepted"] += n_tokens - 1
        for i in range(n_tokens - 1):
            c["pos"][i] += 1

    def metrics_text(self) -> str:
        c, labels = self.counters, f'engine="0",model_name="{self.model}"'
        lines = ["# TYPE vllm:spec_decode_num_drafts_total counter",
                 f"vllm:spec_decode_num_drafts_total{{{labels}}} {float(c['drafts'])}",
                 f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {float(c['draft_tokens'])}",
                 f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {float(c['accepted'])}"]
        lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{i}"}} {float(v)}'
                  for i, v in enumerate(c["pos"])]
        return "\n".join(lines) + "\n" + self.metrics_extra


def _chunk(model: str, texts: list[str], first_id: int, finish=None, with_ids=True) -> dict:
    choice = {"index": 0, "delta": {"content": "".join(texts)}, "finish_reason": finish}
    if with_ids:
        choice["token_ids"] = list(range(first_id, first_id + len(texts)))
        choice["logprobs"] = {"content": [{"token": t, "logprob": -0.1, "bytes": list(t.encode())} for t in texts]}
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": model, "choices": [choice]}


def _handler(fake: FakeServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, status: int, body: str, kind: str = "application/json") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if fake.api_key is None or self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return True
            self._send(401, json.dumps({"error": {"message": "invalid API key"}}))
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path == "/v1/models" and fake.models_status is not None:
                self._send(fake.models_status, fake.models_body or "", "text/html")
            elif self.path == "/v1/models":
                self._send(200, json.dumps({"object": "list", "data": [{"id": fake.model, "max_model_len": 2048}]}))
            elif self.path == "/version" and fake.vllm:
                self._send(200, json.dumps({"version": fake.version}))
            elif self.path == "/metrics" and fake.vllm:
                self._send(200, fake.metrics_text() if fake.speculates else "# no speculation\n", "text/plain")
            else:
                self._send(404, json.dumps({"detail": "Not Found"}))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.requests.append(body)
            if not self._authorized():
                return
            if fake.hold_headers:
                fake.released.wait(30)  # a server that answers nothing until its first token
            fake.answered.set()
            if fake.status is not None:
                self._send(fake.status, fake.error_body or json.dumps({"error": {"message": "scripted failure"}}))
                return
            if fake.whole_answer is not None:
                self._send(200, json.dumps(fake.whole_answer))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self._stream(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away (a stop)

        def _event(self, payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _stream(self, body: dict) -> None:
            if fake.raw_events is not None:
                self.close_connection = True  # the client may leave after a bad chunk
                for event in fake.raw_events:
                    self._event(json.dumps(event))
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
                return
            with_ids = bool(body.get("return_token_ids"))
            self._event(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                                    "usage": {"prompt_tokens": 7, "completion_tokens": 0}}))
            next_id = 100
            steps = fake.steps[: body.get("max_tokens", 10**6)]
            for n, texts in enumerate(steps):
                if fake.die_after is not None and n == fake.die_after:
                    self.connection.shutdown(2)  # the server process is gone: no [DONE], no chunk end
                    return
                if fake.malformed_after is not None and n == fake.malformed_after:
                    self._event("{not json")
                if fake.stall_after is not None and n == fake.stall_after:
                    fake.released.wait(30)
                time.sleep(fake.delay_s)
                last = n == len(steps) - 1
                if last and fake.finish == "stop":
                    texts = texts + [""]  # the stop token: in the ids, not in the text
                fake.book(len(texts))
                self._event(json.dumps(_chunk(fake.model, texts, next_id, fake.finish if last else None, with_ids)))
                next_id += len(texts)
            self._event(json.dumps({"choices": [], "usage": {"prompt_tokens": 7}}))
            self._event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler
