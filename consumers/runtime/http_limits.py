"""uvicorn's httptools protocol with the limits uvicorn lacks: header bytes, header time, body pace.

`serve` (the send API) and `console` both run it; nothing else in the framework
imports it (it needs uvicorn and httptools, which their extras bring).

What uvicorn 0.54 does with a request (read in its source,
`uvicorn/protocols/http/httptools_impl.py`):
- no limit on a head's size: httptools gathers a header line of any length
  (a 32 MB line was accepted and held in memory); only the h11 protocol has
  one (`h11_max_incomplete_event_size`), and h11 is the slower parser;
- no deadline for a head or a body: `timeout_keep_alive` is armed only after
  a response and is cancelled by any byte that arrives, so a client sending
  one byte every few seconds, or announcing a body and never sending it,
  holds a connection and its request's task forever.

`GuardedHttpTools` keeps httptools and adds them:
- past `max_header_bytes` before the head is complete, 431 and the
  connection closed;
- a head not complete `header_timeout_seconds` after the connection opened
  (or after the last response on it), 408 and closed;
- a body not complete by `body_timeout_seconds` after its head, plus one
  second for every `body_min_rate` bytes of it that came (Apache's
  mod_reqtimeout `body=...,MinRate=...`): 408 and closed, or only closed if
  the request was answered already. Time the server itself keeps the client
  waiting (reading paused while the app has not taken what came, or a
  `100 Continue` not yet sent) is not counted against it.

A body's size limit is the route's own (`ingress.body`, `console.signin`), read
through `read_within`: past it before its rest is read, gone if the client went.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState


@dataclass(frozen=True, slots=True, kw_only=True)
class WireLimits:
    max_header_bytes: int = 32_768  # the request line and every header, together
    header_timeout_seconds: float = 10.0  # from the connection (or last answer) to a whole head
    body_timeout_seconds: float = 30.0  # from a whole head to a whole body, at the least
    body_min_rate: float = 500.0  # bytes a second: each that many of the body adds a second


def _answer(status: bytes) -> bytes:
    return b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


LINGER_SECONDS = 2.0  # how long a refused client may still send before the close
TOO_LARGE = _answer(b"431 Request Header Fields Too Large")
TOO_SLOW = _answer(b"408 Request Timeout")


def guarded(limits: WireLimits) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn (`Config(http=...)`), with `limits`."""

    class _Guarded(GuardedHttpTools):
        wire_limits = limits

    return _Guarded


class GuardedHttpTools(HttpToolsProtocol):
    wire_limits = WireLimits()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, object],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False
        # The body being read: since when its pace is counted, how much came since.
        self._in_body = False
        self._body_since = 0.0
        self._body_bytes = 0
        self._body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped until the client has our answer and goes
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._in_head
            and self._head_bytes > self.wire_limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._refuse(TOO_LARGE)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._disarm()
        super().on_headers_complete()
        # A request without a body completes in the same feed, which disarms this.
        self._in_body = True
        self._restart_body_clock()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        self._disarm_body()
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0  # what comes next is the next head

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(
            self.wire_limits.header_timeout_seconds, self._too_slow
        )

    def _disarm(self) -> None:
        _cancel(self._head_timer)
        self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            self._refuse(TOO_SLOW if self._head_bytes else b"")

    def _restart_body_clock(self) -> None:
        self._disarm_body()
        self._body_since, self._body_bytes = self.loop.time(), 0
        self._body_timer = self.loop.call_later(
            self.wire_limits.body_timeout_seconds, self._body_due
        )

    def _disarm_body(self) -> None:
        _cancel(self._body_timer)
        self._body_timer = None

    def _body_due(self) -> None:
        """The body's deadline as it stood when armed: moved by what came since, or passed."""
        self._body_timer = None
        if not self._in_body or self._refused or self.transport.is_closing():
            return
        cycle = self.cycle
        if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
            self._restart_body_clock()  # the wait is the server's: the client starts afresh
            return
        limits = self.wire_limits
        due = self._body_since + limits.body_timeout_seconds
        due += self._body_bytes / limits.body_min_rate
        left = due - self.loop.time()
        if left > 0:
            self._body_timer = self.loop.call_later(left, self._body_due)
            return
        answered = cycle is not None and cycle.response_started
        self._refuse(b"" if answered else TOO_SLOW)

    def _refuse(self, answer: bytes) -> None:
        """Answer, then close gently: a close with the client's bytes unread would reset the
        connection, and a reset can destroy the answer before the client reads it."""
        self._disarm()
        self._disarm_body()
        self._refused = True
        if answer:
            self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._head_timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    """Cancel `timer`, if there is one."""
    if timer is not None:
        timer.cancel()


class BodyTooLarge(Exception):
    """A request body past the route's limit: refused before what is past it is read."""


class ClientGone(Exception):
    """The client went before its body was whole (it hung up, or was closed for its
    pace): nobody reads the answer, and it is no server error to log."""


async def read_within(request: Request, limit: int) -> bytes:
    """The whole body, at most `limit` bytes.

    BodyTooLarge from Content-Length before a byte of the body is read, or once a
    chunked body passes `limit` (so a body is never held past it); ClientGone if the
    client went before the body was whole."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(chunks)
