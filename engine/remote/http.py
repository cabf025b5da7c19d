"""HTTP for the remote backend, on httpx2: JSON GETs, text GETs and a server-sent-events stream that
another thread can stop at once.

Every failure becomes a `RemoteError` with one line a user can act on: the server is not running, did
not answer in time, refused the key, has no such model, answered with an HTTP error, or closed the
stream early. Only http and https URLs are accepted; TLS certificates are verified unless the user
turned that off for this server. What httpx2 lacks: a way to stop a read that waits on the server from
another thread (closing a response or client there leaves the read waiting until its timeout), so the
stream keeps the socket it is carried on and shuts that down.
"""

from __future__ import annotations

import functools
import html
import ipaddress
import json
import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2

from ..api.errors import ContextTooLongError, SpeculaError, first_line

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 120.0  # the longest silence inside a stream (a long prompt's prefill comes first)


class RemoteError(SpeculaError):
    """The server could not be reached or did not answer as an OpenAI-compatible server does; `status`
    is the HTTP status it answered with, None when it did not answer."""

    status: int | None = None


class AuthError(RemoteError):
    """The server refused the request's API key (HTTP 401 or 403)."""


@dataclass(frozen=True)
class Server:
    """Where to reach an OpenAI-compatible server and how to talk to it."""

    url: str  # the base URL, e.g. http://127.0.0.1:8011 (a trailing /v1 is allowed)
    api_key: str | None = None
    verify_tls: bool = True
    timeout_s: float = READ_TIMEOUT_S
    allow_http_key: bool = False  # the user said a key may go unencrypted to a host that is not this machine

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", normalize_url(self.url))
        host = urlsplit(self.url).hostname or ""
        if self.api_key and self.url.startswith("http://") and not is_loopback(host) and not self.allow_http_key:
            raise RemoteError(f"an API key would be sent unencrypted over http:// to {host}: use https://, or allow "
                              "it explicitly (--allow-http-key; in the app, the server settings' checkbox)")

    @property
    def root(self) -> str:
        """The URL without the /v1 API prefix (where /metrics and /version live)."""
        return self.url[: -len("/v1")] if self.url.endswith("/v1") else self.url

    @property
    def api(self) -> str:
        return self.root + "/v1"


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")


def without_credentials(url: str) -> str:
    """`url` without a user name or password (what error messages may show)."""
    return _USERINFO.sub(r"\1", url)


def normalize_url(url: str) -> str:
    """`url` checked and without a trailing slash; only http and https, with a host, without credentials."""
    raw = (url or "").strip().rstrip("/")
    text = without_credentials(raw)  # every message below shows this, never a password
    if not text:
        raise RemoteError("no server URL given: use e.g. http://127.0.0.1:8011")
    if any(c.isspace() or not c.isprintable() for c in text):
        raise RemoteError(f"server URL must not contain spaces or control characters: {text!r}")
    if text != raw:
        raise RemoteError(f"server URL must not contain a user name or password: give the key with --api-key-env "
                          f"(in the app, the server settings) and use {text}")
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise RemoteError(f"server URL is not valid ({exc}): '{text}'") from None
    if parts.scheme not in ("http", "https"):
        raise RemoteError(f"server URL must start with http:// or https://, got '{text}'")
    if not parts.hostname:
        raise RemoteError(f"server URL has no host: '{text}'")
    if parts.query or parts.fragment:
        raise RemoteError(f"server URL must not have a query or fragment: '{text}'")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise RemoteError(f"server URL has a bad port: '{text}'") from None
    return text


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine (localhost, 127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_FAILURES = (httpx2.HTTPError, httpx2.StreamError, httpx2.InvalidURL, OSError)  # what a request can raise


@functools.cache
def _client(verify_tls: bool) -> httpx2.Client:
    """The client shared by all threads for servers with (or without) TLS verification: a new connection
    for each request (a stream's socket is its own to shut down), no proxy or credentials from the
    environment (the engine on this machine is reached directly), no redirects."""
    verify = httpx2.create_ssl_context() if verify_tls else False  # honours SSL_CERT_FILE and SSL_CERT_DIR
    return httpx2.Client(verify=verify, trust_env=False, limits=httpx2.Limits(max_keepalive_connections=0))


def _headers(server: Server, body: bool) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", "User-Agent": "specula"}
    if body:
        headers["Content-Type"] = "application/json"
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    return headers


def open_response(server: Server, method: str, url: str, payload: dict | None, timeout: float,
                  on_socket: Callable[[socket.socket], None] | None = None) -> httpx2.Response:
    """Send a request; returns the response with a 2xx status, its body not read yet, or raises RemoteError.
    `timeout` bounds connecting and each wait for the server. `on_socket(sock)` gets each socket once
    connected (the TCP one, then for https the TLS one), before the answer is awaited."""
    def trace(name: str, info: dict) -> None:  # httpx2's hook for the stages of a request
        if name in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            on_socket(info["return_value"].get_extra_info("socket"))

    client = _client(server.verify_tls)
    body = json.dumps(payload).encode() if payload is not None else None
    try:
        request = client.build_request(method, url, content=body, headers=_headers(server, body is not None),
                                       timeout=timeout, extensions={"trace": trace} if on_socket else None)
        response = client.send(request, stream=True)
    except BaseException as exc:
        waited = "accept a connection" if isinstance(exc, httpx2.ConnectTimeout) else "answer"
        raise _network_error(server, exc, f"did not {waited} within {timeout:.0f} s") from None
    if not response.is_success:
        try:
            text = _read_upto(response, 64 * 1024).decode("utf-8", "replace")
        except _FAILURES:
            text = ""
        finally:
            response.close()
        raise http_error(url, response.status_code, response.reason_phrase, text)
    return response


def _read_upto(response: httpx2.Response, limit: int) -> bytes:
    """The first `limit` bytes of a response's body (all of it when shorter)."""
    data = bytearray()
    for piece in response.iter_bytes():
        data += piece
        if len(data) >= limit:
            break
    return bytes(data[:limit])


def _network_error(server: Server, exc: BaseException, timed_out: str) -> BaseException:
    """One line for a failure to reach or hear from the server; `timed_out` says what a timeout means."""
    root = exc
    for _ in range(8):  # httpx2 raises each of its errors from (or while handling) the one it wraps
        if (root.__cause__ or root.__context__) is None:
            break
        root = root.__cause__ or root.__context__
    if isinstance(root, ssl.SSLCertVerificationError):
        return RemoteError(f"the TLS certificate of {server.root} could not be verified ({root.verify_message}); "
                           "use a trusted certificate, or turn off verification for this server")
    if isinstance(root, ConnectionRefusedError):
        return RemoteError(f"cannot reach the server at {server.root}: connection refused (is it running?)")
    if isinstance(exc, httpx2.TimeoutException) or isinstance(root, TimeoutError):
        return RemoteError(f"the server at {server.root} {timed_out}")
    if isinstance(root, socket.gaierror):
        return RemoteError(f"cannot find the server's host in {server.root} ({root.strerror})")
    if isinstance(exc, _FAILURES):
        detail = _BYTES.sub(r"\1", str(root).strip()) or type(exc).__name__
        if isinstance(exc, httpx2.RemoteProtocolError) and "illegal" in detail:  # h11's: it saw no HTTP answer
            detail += " (it does not answer in HTTP)"
        return RemoteError(f"cannot talk to the server at {server.root}: {detail[:300]}")
    return exc


_BYTES = re.compile(r"""bytearray\(b('[^']*'|"[^"]*")\)""")  # h11 quotes what it read as bytearray(b'...')


def _shutdown(sock: socket.socket | None) -> None:
    """Shut `sock` down, so that a read waiting on it in another thread returns at once. The plain socket's
    shutdown, also for TLS: an SSLSocket's own would drop its TLS state under the reading thread."""
    if sock is None:
        return
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, by the server or by the reading thread


class EngineError(RemoteError):
    """An error `specula serve` reported, with the engine's own kind of error (Failed.kind)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _engine_kind(body: str) -> str | None:
    """The engine's kind of error in a `specula serve` error body ({"specula": {"kind": ...}})."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # a reply nested too deeply for Python's reader is malformed too
        return None
    extension = data.get("specula") if isinstance(data, dict) else None
    kind = extension.get("kind") if isinstance(extension, dict) else None
    return kind if isinstance(kind, str) else None


def http_error(url: str, status: int, reason: str, body: str) -> RemoteError:
    """A one-line error for a non-2xx answer, with the server's own message when it sent one."""
    error = _http_error(url, status, reason, body)
    error.status = status
    return error


def _http_error(url: str, status: int, reason: str, body: str) -> RemoteError:
    message = _error_message(body)
    kind = _engine_kind(body)
    if kind is not None:
        return EngineError(message or f"HTTP {status}", kind)
    if status in (401, 403):
        return AuthError(f"the server refused the API key (HTTP {status}{': ' + message if message else ''}); "
                         "set the key's environment variable or store it in Settings")
    if status == 400 and "context length" in message.lower():
        return ContextTooLongError(f"the conversation does not fit in the server's context: {message}")
    if status == 404 and "model" in message.lower():
        return RemoteError(f"the server has no such model: {message}")
    what = message or _page_text(body) or (body.strip().splitlines()[0][:200] if body.strip() else reason)
    return RemoteError(f"the server answered HTTP {status} for {urlsplit(url).path}: {what}")


_HIDDEN = re.compile(r"<(script|style|head)\b.*?</\1\s*>", re.S | re.I)
_TAG = re.compile(r"<[^>]*>")


def _page_text(body: str) -> str:
    """An HTML page's first line of text, marked as a page; empty when `body` is not HTML."""
    start = body.lstrip()[:200].lower()
    if not start.startswith(("<!doctype", "<html", "<head", "<body", "<h1", "<p", "<pre", "<div", "<title")):
        return ""
    text = html.unescape(_TAG.sub("\n", _HIDDEN.sub("", body)))
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return f"{lines[0][:200]} (an HTML page)" if lines else "an HTML page"


def _error_message(body: str) -> str:
    """The message in an OpenAI-style error body ({"error": {"message": ...}} or {"message": ...})."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return " ".join(error["message"].split())[:300]
        if isinstance(error, str):
            return " ".join(error.split())[:300]
        if isinstance(data.get("detail"), str):
            return data["detail"][:300]
    return ""


def request_text(server: Server, method: str, url: str, payload: dict | None = None,
                 timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Send a request and read its whole answer as text; RemoteError on any failure."""
    response = open_response(server, method, url, payload, timeout)
    try:
        return response.read().decode("utf-8", "replace")
    except _FAILURES as exc:
        raise _network_error(server, exc, f"stopped answering for {timeout:.0f} s") from None
    finally:
        response.close()


def get_text(server: Server, path: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    return request_text(server, "GET", server.root + path, None, timeout)


def get_json(server: Server, path: str, timeout: float = CONNECT_TIMEOUT_S):
    text = get_text(server, path, timeout)
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise RemoteError(f"the server's answer to {path} is not JSON (is {server.root} an OpenAI-compatible "
                          "server?)") from None


class EventStream:
    """The `data:` payloads of a server-sent-events response, parsed as JSON, until `[DONE]`.

    `close()` may be called from any thread: it shuts the socket down, so a read that waits for the
    server returns at once and iteration ends quietly (`closed` is then true).
    """

    def __init__(self, server: Server, path: str, payload: dict, root: bool = False) -> None:
        """POST `payload` to `path` under the server's /v1 (under its root with `root`). A `close()` from
        another thread while the server has not answered yet ends the wait at once (no events)."""
        self.server = server
        self.closed = False
        self.done = False  # the server sent [DONE]
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._response: httpx2.Response | None = None
        self._busy = True  # a thread opens or reads it: that thread closes it, never another under it
        response = None
        try:
            response = open_response(server, "POST", (server.root if root else server.api) + path, payload,
                                     server.timeout_s, self._connected)
        except RemoteError:
            if not self.closed:
                raise
        finally:
            with self._lock:
                self._response, self._busy, closed = response, False, self.closed
        if closed and response is not None:
            response.close()

    def _connected(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock, closed = sock, self.closed
        if closed:
            _shutdown(sock)

    def close(self) -> None:
        """Shut the socket down (a waiting read returns); the response itself is closed here only when no
        thread opens or reads it, else by that thread, so the two never close it at once."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            sock, busy, response = self._sock, self._busy, self._response
        _shutdown(sock)
        if response is not None and not busy:
            response.close()

    def __iter__(self) -> Iterator[dict]:
        with self._lock:
            if self.closed or self._response is None:
                return
            self._busy = True
        try:
            yield from self._events()
        finally:
            with self._lock:
                self._busy, self.closed = False, True
            self._response.close()

    def _events(self) -> Iterator[dict]:
        kind = self._response.headers.get("Content-Type", "").lower()
        if "json" in kind and "event-stream" not in kind:
            yield from self._whole_answer()
            return
        if kind.partition(";")[0].strip() != "text/event-stream":
            raise RemoteError(f"the server answered with {kind or 'no content type'!r} instead of a stream of "
                              f"events (is {self.server.root} an OpenAI-compatible server?)")
        try:
            for sse in httpx2.EventSource(self._response, max_event_size=MAX_ANSWER_BYTES):
                if self.closed:
                    return
                if not sse.data:
                    continue  # an event without data (a name or id alone)
                if sse.data.strip() == "[DONE]":
                    self.done = True
                    return
                event = parse_event(sse.data)
                choices = event.get("choices")
                if isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason")
                                                     for c in choices):
                    self.done = True  # the answer is complete even if no [DONE] follows
                yield event
        except httpx2.SSEError as exc:
            if not self.closed:
                raise RemoteError(f"the server sent a malformed stream: {first_line(exc)}") from None
        except _FAILURES as exc:
            if not self.closed:
                raise self._broken(exc) from None
        if not self.closed and not self.done:
            raise RemoteError("the server closed the stream before the answer ended")

    def _broken(self, exc: BaseException) -> RemoteError:
        """One line for a stream that failed after the server began to answer."""
        if isinstance(exc, httpx2.TimeoutException):
            return RemoteError(f"the server at {self.server.root} sent nothing for {self.server.timeout_s:.0f} s")
        return RemoteError(f"the connection to the server broke during the answer ({first_line(exc)})")

    def _whole_answer(self) -> Iterator[dict]:
        """A server that answered with one JSON completion instead of a stream: its choices' messages
        become one chunk's deltas."""
        try:
            text = _read_upto(self._response, MAX_ANSWER_BYTES).decode("utf-8", "replace")
        except _FAILURES as exc:
            if self.closed:
                return
            raise self._broken(exc) from None
        if self.closed:
            return
        event = parse_event(text)
        choices = event.get("choices")
        if isinstance(choices, list):
            event = dict(event, choices=[_as_delta(c) for c in choices])
        self.done = True
        yield event


MAX_ANSWER_BYTES = 64 * 1024 * 1024  # the largest answer read in one piece (a server that does not stream)


def _as_delta(choice):
    """A non-streamed choice ({"message": ...}) as a streamed one ({"delta": ...})."""
    if isinstance(choice, dict) and "delta" not in choice and "message" in choice:
        choice = {**{k: v for k, v in choice.items() if k != "message"}, "delta": choice["message"]}
    return choice


def parse_event(payload: str) -> dict:
    try:
        event = json.loads(payload)
    except (ValueError, RecursionError):
        raise RemoteError(f"the server sent a malformed stream event: {payload[:120]!r}") from None
    if not isinstance(event, dict):
        raise RemoteError(f"the server sent a malformed stream event: {payload[:120]!r}")
    if "error" in event and not event.get("choices"):
        kind = _engine_kind(payload)
        if kind is not None:
            raise EngineError(_error_message(payload), kind)
        raise RemoteError(f"the server reported an error during the answer: {_error_message(json.dumps(event))}")
    return event

