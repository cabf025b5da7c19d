"""What `specula serve` checks before a route sees a request (docs/SERVER.md, "Security").

- No web page can drive it: a request that carries an `Origin` other than the server's own (every
  cross-site request a browser makes) is refused with 403, on every route; a body must be
  `application/json` (a browser sends other types cross-site without asking first), else 415; and a
  server without an API key answers only requests whose `Host` is a loopback name with its own port
  (a DNS-rebinding page's requests carry the page's host name), else 403.
- With an API key, every route but /health needs `Authorization: Bearer KEY`, checked from the headers before
  anything else is spent on the request: a request without the key is answered 401 before its body is read
  or a place among the `max_active` is counted, so clients without the key cannot keep out those with it.
- Bounded work: more than `max_active` requests at once get a JSON 503; a body larger than `max_body` bytes
  is refused with 413 before it is kept (the rest of it is read and dropped, up to `DRAIN_BYTES`, so that a
  client that sends it whole reads the 413 rather than a reset connection); a body
  that does not arrive within `BODY_TIMEOUT_S` (or stalls for `BODY_IDLE_S`) gets 408; a client that
  leaves while sending it gets nothing and leaves nothing in the log. Request headers that do not arrive
  within `HEADER_TIMEOUT_S` close the connection (`Protocol`).

The body is read here, whole, and handed to the route as one message; what the client sends after it
(its disconnect) reaches the route as it comes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from . import faults

log = logging.getLogger(__name__)
HEADER_TIMEOUT_S = 30.0  # a request's headers, from the connection (or the last answer) on
BODY_TIMEOUT_S = 60.0  # a request's whole body
BODY_IDLE_S = 15.0  # the longest pause inside a body
MAX_BODY_BYTES = 4 << 20  # a 128k-token conversation is about 0.5 MB of JSON
DRAIN_BYTES = 64 << 20  # the most of a body refused as too large that is read (and dropped) so its client reads the 413
MAX_ACTIVE = 256  # requests read or answered at once (streams included); beyond: 503, JSON like every 5xx
BODY_METHODS = {"POST", "PUT", "PATCH"}


def loopback_name(host: str) -> bool:
    """Whether a host name (from a Host or Origin header, without the port) always means this machine."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """'host:port' (or '[v6]:port', or 'host') as (host, port); None when it is not one."""
    try:
        parts = urlsplit("//" + authority)
        return (parts.hostname or "", parts.port) if parts.hostname else None
    except ValueError:  # a port that is not a number, a bracket left open
        return None


class Guard:
    """The checks above, in front of the routes (outermost: before the API key is looked at)."""

    def __init__(self, app: ASGIApp, *, key: str | None = None, port: int | None = None,
                 max_body: int = MAX_BODY_BYTES, max_active: int = MAX_ACTIVE) -> None:
        self.app, self.key, self.port, self.max_body = app, key or None, port, max_body
        self.max_active, self.active = max_active, 0  # requests being read or answered now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.refusal(scope, headers)  # from the headers alone: before a place is taken or a body read
        if refusal is not None:
            await self._refuse(refusal, scope, receive, send, headers)
            return
        if self.active >= self.max_active:  # far beyond what the queue holds: a flood, answered at once
            busy = faults.ApiError(503, f"the server is handling {self.active} requests, its most; try again "
                                   "shortly", "server_error", code="server_busy")
            await JSONResponse(busy.body(), status_code=503, headers={"Retry-After": "5"})(scope, receive, send)
            return
        self.active += 1
        try:
            await self._guarded(scope, headers, receive, send)
        finally:
            self.active -= 1

    async def _guarded(self, scope: Scope, headers: Headers, receive: Receive, send: Send) -> None:
        if scope["method"] in BODY_METHODS:
            refusal, body = await self._body(headers, receive)
            if refusal is not None:
                await self._refuse(refusal, scope, receive, send, headers)
                return
            if body is None:
                return  # the client left while sending its body: nobody to answer
            receive = _replay(body, receive)
        await self._answered(scope, receive, send)

    @staticmethod
    async def _refuse(refusal: faults.ApiError, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        """The refusal as JSON; the connection closed after it where a body was left unread (or cut off)."""
        unread = scope["method"] in BODY_METHODS and _has_body(headers)
        close = refusal.status in (408, 413) or unread
        await JSONResponse(refusal.body(), status_code=refusal.status,
                           headers={"Connection": "close"} if close else None)(scope, receive, send)

    async def _answered(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The route's answer; an error no route handled becomes a JSON 500 (one log line with its traceback),
        a client that left while its body was read ends quietly."""
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:
            return
        except Exception as exc:
            log.error("%s %s failed: %s: %s", scope["method"], scope["path"], type(exc).__name__, exc, exc_info=True)
            if not started:
                error = faults.ApiError(500, f"the server failed on this request ({type(exc).__name__}); its log "
                                        "says more", "server_error", code="internal_error")
                await JSONResponse(error.body(), status_code=500)(scope, receive, send)

    def refusal(self, scope: Scope, headers: Headers) -> faults.ApiError | None:
        host = headers.get("host", "")
        if self.key is None and not self._own_host(host):
            return faults.ApiError(403, "this server has no API key, so it answers only requests addressed to "
                                   f"it by a loopback name (Host {_shown(host)} is not one); use "
                                   f"http://127.0.0.1:{self.port or 'PORT'}", "permission_error", code="host_not_allowed")
        origin = headers.get("origin")
        if origin is not None and not self._same_origin(origin, host):
            return faults.ApiError(403, f"requests from web pages are refused (Origin {_shown(origin)}): this server "
                                   "is for programs on this machine", "permission_error", code="origin_not_allowed")
        if self.key is not None and scope["path"] != "/health" and not self._has_key(headers):
            return faults.ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                   "authentication_error", code="invalid_api_key")
        if scope["method"] in BODY_METHODS and _has_body(headers):
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return faults.ApiError(415, f"the body must be JSON sent with 'Content-Type: application/json' "
                                       f"(got {_shown(kind) if kind else 'none'})", code="unsupported_media_type")
        return None

    def _has_key(self, headers: Headers) -> bool:
        """Whether the request carries the key (compared in constant time)."""
        given = headers.get("authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        return hmac.compare_digest(token.encode("utf-8", "surrogateescape"), self.key.encode())

    def _own_host(self, host: str) -> bool:
        parts = split_authority(host)
        return parts is not None and loopback_name(parts[0]) and (self.port is None or parts[1] in (None, self.port))

    def _same_origin(self, origin: str, host: str) -> bool:
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc.lower() == host.lower()

    async def _body(self, headers: Headers, receive: Receive) -> tuple[faults.ApiError | None, bytes | None]:
        """(refusal, body): the whole body, None when the client left, or why it was refused."""
        too_large = faults.ApiError(413, f"the body is larger than this server accepts ({self.max_body} bytes; "
                                    "--max-body-mb)", code="body_too_large")
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            await _drain(headers, receive)
            return too_large, b""
        chunks, size = [], 0
        deadline = time.monotonic() + BODY_TIMEOUT_S
        while True:
            message = await _next_part(receive, deadline)
            if message is None:
                return faults.ApiError(408, f"the body did not arrive in time (at most {BODY_IDLE_S:g} s without "
                                       f"data, {BODY_TIMEOUT_S:g} s in all)", code="request_timeout"), b""
            if message["type"] == "http.disconnect":
                return None, None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                if message.get("more_body", False):
                    await _drain(headers, receive)
                return too_large, b""
            chunks.append(chunk)
            if not message.get("more_body", False):
                return None, b"".join(chunks)


async def _next_part(receive: Receive, deadline: float) -> Message | None:
    """The client's next message (a part of its body, or its disconnect); None where it does not come within
    BODY_IDLE_S or by `deadline`."""
    try:
        return await asyncio.wait_for(receive(), max(0.0, min(BODY_IDLE_S, deadline - time.monotonic())))
    except asyncio.TimeoutError:
        return None


async def _drain(headers: Headers, receive: Receive) -> None:
    """Read and drop the rest of a body refused as too large, up to DRAIN_BYTES (and the time a body may take), before
    the 413 is sent: a client that sends its whole body before it reads the answer (most do) then reads the 413, where
    closing on a body still arriving resets the connection under it. A client that waits for "100 Continue" has
    sent nothing yet, and is answered at once."""
    if "100-continue" in headers.get("expect", "").lower():
        return
    left, deadline = DRAIN_BYTES, time.monotonic() + BODY_TIMEOUT_S
    while left > 0:
        message = await _next_part(receive, deadline)
        if message is None or message["type"] == "http.disconnect":
            return
        left -= len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return (length is not None and length.strip() not in ("", "0")) or "transfer-encoding" in headers


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the body read already, then what the client sends next (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _shown(text: str, most: int = 80) -> str:
    """A header's value as an error message quotes it: printable, and cut."""
    clean = "".join(c if c.isprintable() else "?" for c in text)
    return repr(clean if len(clean) <= most else clean[:most] + "...")


class Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for a request's headers: a connection that opens (or
    finishes an answer) and does not send a whole request head within HEADER_TIMEOUT_S is closed, so
    half-sent headers cannot hold connections open (uvicorn's keep-alive timeout ends at the first byte)."""

    header_timeout_s = HEADER_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # a request head arrived

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()
