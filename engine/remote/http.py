"""HTTP for the remote backend, on the standard library: JSON GETs, text GETs and a server-sent-events
stream that another thread can stop at once.

Every failure becomes a `RemoteError` with one line a user can act on: the server is not running, did
not answer in time, refused the key, has no such model, answered with an HTTP error, or closed the
stream early. Only http and https URLs are accepted; TLS certificates are verified unless the user
turned that off for this server.
"""

from __future__ import annotations

import html
import http.client
import ipaddress
import json
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import urlsplit

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
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _connection(server: Server, url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.scheme == "https":
        context = ssl.create_default_context()
        if not server.verify_tls:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout, context=context), path
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), path


def _headers(server: Server, body: bool) -> dict[str, str]:
    headers = {"Accept": "application/json, text/event-stream", "User-Agent": "specula"}
    if body:
        headers["Content-Type"] = "application/json"
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
    return headers


def _request(server: Server, method: str, url: str, payload: dict | None, timeout: float, on_connect=None):
    """Send a request; returns (connection, response) with a 2xx status, or raises RemoteError.
    `on_connect(conn)` is called once connected, before the answer is awaited."""
    conn, path = _connection(server, url, timeout)
    body = json.dumps(payload).encode() if payload is not None else None
    waited = "accept a connection"
    try:
        conn.connect()
        conn.sock.settimeout(timeout)
        if on_connect is not None:
            on_connect(conn)
        waited = "answer"
        conn.request(method, path, body=body, headers=_headers(server, body is not None))
        response = conn.getresponse()
    except BaseException as exc:
        conn.close()
        raise _network_error(server, url, exc, f"did not {waited} within {timeout:.0f} s") from None
    if not 200 <= response.status < 300:
        try:
            text = response.read(64 * 1024).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException):
            text = ""
        finally:
            conn.close()
        raise http_error(url, response.status, response.reason, text)
    return conn, response


def _network_error(server: Server, url: str, exc: BaseException, timed_out: str) -> BaseException:
    """One line for a failure to reach or hear from the server; `timed_out` says what a timeout means."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return RemoteError(f"the TLS certificate of {server.root} could not be verified ({exc.verify_message}); "
                           "use a trusted certificate, or turn off verification for this server")
    if isinstance(exc, ConnectionRefusedError):
        return RemoteError(f"cannot reach the server at {server.root}: connection refused (is it running?)")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return RemoteError(f"the server at {server.root} {timed_out}")
    if isinstance(exc, socket.gaierror):
        return RemoteError(f"cannot find the server's host in {server.root} ({exc.strerror})")
    if isinstance(exc, (OSError, http.client.HTTPException)):
        detail = str(exc).strip() or type(exc).__name__
        return RemoteError(f"cannot talk to the server at {server.root}: {detail}")
    return exc


class EngineError(RemoteError):
    """An error `specula serve` reported, with the engine's own kind of error (Failed.kind)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _engine_kind(body: str) -> str | None:
    """The engine's kind of error in a `specula serve` error body ({"specula": {"kind": ...}})."""
    try:
        data = json.loads(body)
    except ValueError:
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
    except ValueError:
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


def get_text(server: Server, path: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    conn, response = _request(server, "GET", server.root + path, None, timeout)
    try:
        return response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as exc:
        raise _network_error(server, server.root + path, exc, f"stopped answering for {timeout:.0f} s") from None
    finally:
        conn.close()


def get_json(server: Server, path: str, timeout: float = CONNECT_TIMEOUT_S):
    text = get_text(server, path, timeout)
    try:
        return json.loads(text)
    except ValueError:
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
        self._conn = None
        self._sock = None
        self._response = None
        self._reading = False  # a thread iterates: it closes the connection itself (http.client is not thread-safe)
        try:
            self._conn, self._response = _request(server, "POST", (server.root if root else server.api) + path,
                                                  payload, server.timeout_s, self._connected)
        except RemoteError:
            if not self.closed:
                raise
        self._sock = self._conn.sock if self._conn is not None else self._sock

    def _connected(self, conn) -> None:
        with self._lock:
            self._conn, self._sock, closed = conn, conn.sock, self.closed
        if closed:
            self.close(force=True)

    def close(self, force: bool = False) -> None:
        """Shut the socket down (a waiting read returns); the connection itself is closed here only when
        no thread reads it, else by the reading thread, so the two never close it at once."""
        with self._lock:
            if self.closed and not force:
                return
            self.closed = True
            sock, conn, reading = self._sock, self._conn, self._reading
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by the server
        if conn is not None and not reading:
            conn.close()

    def __iter__(self) -> Iterator[dict]:
        with self._lock:
            if self.closed:
                return
            self._reading = True
        try:
            yield from self._events()
        finally:
            with self._lock:
                self._reading, self.closed, conn = False, True, self._conn
            if conn is not None:
                conn.close()

    def _events(self) -> Iterator[dict]:
        data: list[str] = []
        if self._response is None:  # closed before the server answered
            return
        kind = (self._response.getheader("Content-Type") or "").lower()
        if "json" in kind and "event-stream" not in kind:
            yield from self._whole_answer()
            return
        while True:
            try:
                raw = self._response.readline()
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if self.closed:
                    return
                if isinstance(exc, (socket.timeout, TimeoutError)):
                    raise RemoteError(f"the server at {self.server.root} sent nothing for "
                                      f"{self.server.timeout_s:.0f} s") from None
                raise RemoteError(f"the connection to the server broke during the answer ({first_line(exc)})") from None
            if self.closed:
                return
            if not raw:  # end of the response
                if data:
                    yield parse_event("\n".join(data))
                if not self.done:
                    raise RemoteError("the server closed the stream before the answer ended")
                return
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if line == "":
                if data:
                    payload = "\n".join(data)
                    data = []
                    if payload.strip() == "[DONE]":
                        self.done = True
                        return
                    event = parse_event(payload)
                    choices = event.get("choices")
                    if isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason")
                                                         for c in choices):
                        self.done = True  # the answer is complete even if no [DONE] follows
                    yield event
                continue
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            field, _, value = line.partition(":")
            if field == "data":
                data.append(value[1:] if value.startswith(" ") else value)

    def _whole_answer(self) -> Iterator[dict]:
        """A server that answered with one JSON completion instead of a stream: its choices' messages
        become one chunk's deltas."""
        try:
            text = self._response.read(MAX_ANSWER_BYTES).decode("utf-8", "replace")
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if self.closed:
                return
            raise RemoteError(f"the connection to the server broke during the answer ({first_line(exc)})") from None
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
    except ValueError:
        raise RemoteError(f"the server sent a malformed stream event: {payload[:120]!r}") from None
    if not isinstance(event, dict):
        raise RemoteError(f"the server sent a malformed stream event: {payload[:120]!r}")
    if "error" in event and not event.get("choices"):
        kind = _engine_kind(payload)
        if kind is not None:
            raise EngineError(_error_message(payload), kind)
        raise RemoteError(f"the server reported an error during the answer: {_error_message(json.dumps(event))}")
    return event

