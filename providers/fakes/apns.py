"""A local APNs: HTTP/2 over TLS on 127.0.0.1, answering like Apple, recording every request.

```python
async with FakeApns() as apns:
    apns.script("dead-token", status=410)
    provider = ApnsProvider(apns.settings())
```

Built on h2 directly (not an ASGI server): every answer is one HEADERS frame, plus
one body that is split into DATA frames only as flow control demands, like APNs.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error
from h2.settings import SettingCodes

from providers.apns import ApnsSettings
from providers.fakes.ratelimit import FakeRateLimit
from providers.fakes.tls import LocalCertificates, make_apns_signing_key, make_local_certificates

DEFAULT_REASONS = {
    400: "BadDeviceToken",
    403: "InvalidProviderToken",
    410: "Unregistered",
    413: "PayloadTooLarge",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailable",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ApnsReply:
    """How the fake answers: after `latency` seconds, `status` and `reason`, or drop the
    connection (after reading the request, before answering), or `refuse` the stream
    (RST_STREAM REFUSED_STREAM), or `goaway`: GOAWAY naming the stream before this one
    as the last processed (this one and later ones unprocessed), then no more answers
    on that connection. With `until`, the stream stays open until the test sets it."""

    status: int = 200
    reason: str | None = None
    latency: float = 0.0
    drop: bool = False
    retry_after: int | None = None
    refuse: bool = False
    goaway: bool = False
    until: asyncio.Event | None = None  # answer once this is set (then after `latency`)


@dataclass(frozen=True, slots=True, kw_only=True)
class ApnsRequest:
    """One request as the fake read it."""

    token: str
    apns_id: str
    collapse_id: str | None
    headers: Mapping[str, str]
    body: bytes
    received_at: float
    connection_id: int
    stream_id: int

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


@dataclass(slots=True)
class _Script:
    reply: ApnsReply
    remaining: int | None


class FakeApns:
    """A fake APNs server; `.requests` lists what it read, `.script()` sets its answers."""

    def __init__(
        self,
        *,
        topic: str = "com.example.app",
        max_concurrent_streams: int = 1000,
        settings_delay: float = 0.0,
        unscripted: ApnsReply | None = None,
        initial_window_size: int = 65_535,
    ):
        self.topic = topic
        # Advertised in the first SETTINGS frame and enforced from the first byte read:
        # a stream opened beyond it is a connection error (h2's PROTOCOL_ERROR, GOAWAY).
        self.max_concurrent_streams = max_concurrent_streams
        # Seconds between accepting a connection and sending SETTINGS (and reading any
        # request): a server one round trip away, whose limit a client learns late.
        self.settings_delay = settings_delay
        # A stream's flow-control window, in the first SETTINGS (h2's default: 65,535).
        self.initial_window_size = initial_window_size
        self.protocol_errors: list[str] = []  # why a connection was closed on an H2Error
        self.unscripted = unscripted or ApnsReply()  # the answer to a token with no script
        self.rate_limit: FakeRateLimit | None = None  # past it: 429 with Retry-After
        self.requests: list[ApnsRequest] = []
        self.connections_opened = 0
        self._scripts: dict[str, deque[_Script]] = {}
        self._connections: set[_ServerConnection] = set()
        self._server: asyncio.Server | None = None
        self._directory: tempfile.TemporaryDirectory[str] | None = None
        self._certificates: LocalCertificates | None = None
        self._signing_key = make_apns_signing_key()

    async def __aenter__(self) -> Self:
        self._directory = tempfile.TemporaryDirectory(prefix="fake-apns-")
        self._certificates = make_local_certificates(Path(self._directory.name))
        self._server = await asyncio.get_running_loop().create_server(
            self._accept, "127.0.0.1", 0, ssl=self._certificates.server_context()
        )
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.drop()
        closed = [c.closed for c in self._connections]
        if closed:
            await asyncio.wait(closed, timeout=2.0)
        if self._server is not None:
            await self._server.wait_closed()
        if self._directory is not None:
            self._directory.cleanup()

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        assert self._server is not None, "use FakeApns as an async context manager"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def ca_file(self) -> Path:
        assert self._certificates is not None, "use FakeApns as an async context manager"
        return self._certificates.ca_file

    def settings(self, **overrides: Any) -> ApnsSettings:
        """ApnsSettings that reach this fake with token auth (a fresh P-256 key)."""
        values: dict[str, Any] = {
            "topic": self.topic,
            "key": self._signing_key,
            "key_id": "FAKEKEY123",
            "team_id": "FAKETEAM12",
            "host": self.host,
            "port": self.port,
            "ca_file": str(self.ca_file),
        }
        return ApnsSettings(**(values | overrides))

    def script(
        self,
        token: str,
        *,
        status: int = 200,
        reason: str | None = None,
        latency: float = 0.0,
        drop: bool = False,
        retry_after: int | None = None,
        refuse: bool = False,
        goaway: bool = False,
        until: asyncio.Event | None = None,
        times: int | None = None,
    ) -> None:
        """Answer `token`'s next `times` requests (all, if None) this way; scripts queue up."""
        reason = reason if reason is not None or status == 200 else DEFAULT_REASONS.get(status)
        reply = ApnsReply(
            status=status,
            reason=reason,
            latency=latency,
            drop=drop,
            retry_after=retry_after,
            refuse=refuse,
            goaway=goaway,
            until=until,
        )
        self._scripts.setdefault(token, deque()).append(_Script(reply=reply, remaining=times))

    def requests_for(self, token: str) -> list[ApnsRequest]:
        return [r for r in self.requests if r.token == token]

    @property
    def provider_tokens(self) -> list[str]:
        """The distinct `authorization` headers (provider JWTs) read, first use first."""
        return list(dict.fromkeys(r.headers.get("authorization", "") for r in self.requests))

    def drop_connections(self) -> None:
        """Cut every open connection now, without answering."""
        for connection in list(self._connections):
            connection.drop()

    def reply_for(self, token: str) -> ApnsReply:
        limit = self.rate_limit
        if limit is not None and not limit.admit():  # past the quota: refused, whoever
            return ApnsReply(status=429, reason="TooManyRequests", retry_after=limit.retry_after)
        scripts = self._scripts.get(token)
        while scripts:
            script = scripts[0]
            if script.remaining is None:
                return script.reply
            if script.remaining > 0:
                script.remaining -= 1
                return script.reply
            scripts.popleft()
        return self.unscripted

    def _accept(self) -> _ServerConnection:
        self.connections_opened += 1
        connection = _ServerConnection(self, self.connections_opened)
        self._connections.add(connection)
        connection.closed.add_done_callback(lambda _: self._connections.discard(connection))
        return connection


@dataclass(slots=True)
class _Incoming:
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)


class _ServerH2Connection(H2Connection):
    """h2's server side without its per-request walk over every open stream and without
    re-checking the answers it builds (a bench's fake CPU is noise, not its subject).
    Requests are still validated: the fake is the check on the client's headers."""

    def __init__(self, max_streams: int, initial_window_size: int = 65_535) -> None:
        super().__init__(
            H2Configuration(
                client_side=False,
                header_encoding="utf-8",
                validate_outbound_headers=False,
                normalize_outbound_headers=False,
            )
        )
        # The limit in the preface, not h2's 100 until our SETTINGS are acknowledged.
        self.local_settings[SettingCodes.MAX_CONCURRENT_STREAMS] = max_streams
        self.local_settings[SettingCodes.INITIAL_WINDOW_SIZE] = initial_window_size
        self.local_settings.acknowledge()

    @property
    def open_inbound_streams(self) -> int:
        """An upper bound below our own limit; h2's exact count (a walk) only near it."""
        held = len(self.streams)
        if held < self.local_settings.max_concurrent_streams:
            return held
        return super().open_inbound_streams


class _ServerConnection(asyncio.Protocol):
    def __init__(self, fake: FakeApns, connection_id: int) -> None:
        self.fake = fake
        self.connection_id = connection_id
        self.h2 = _ServerH2Connection(fake.max_concurrent_streams, fake.initial_window_size)
        self.transport: asyncio.Transport | None = None
        self.incoming: dict[int, _Incoming] = {}
        self.outgoing: dict[int, bytes] = {}
        self.timers: dict[int, asyncio.TimerHandle | asyncio.Task[None]] = {}
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        encode = functools.partial(self.h2.encoder.encode, huffman=False)
        self.h2.encoder.encode = encode  # type: ignore[method-assign]  # h2 has no huffman option
        self.flush_scheduled = False
        self.going_away = False
        self.held: bytearray | None = None  # read before our SETTINGS went out

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.fake.settings_delay > 0:
            self.held = bytearray()
            self.loop.call_later(self.fake.settings_delay, self.send_preface)
        else:
            self.send_preface()

    def send_preface(self) -> None:
        """SETTINGS, with the stream limit; then whatever the client sent meanwhile."""
        if self.transport is None or self.transport.is_closing():
            return
        self.h2.initiate_connection()
        self.flush()
        held, self.held = self.held, None
        if held:
            self.data_received(bytes(held))

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in self.timers.values():
            timer.cancel()
        if not self.closed.done():
            self.closed.set_result(None)

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        if self.held is not None:
            self.held.extend(data)
            return
        try:
            events = self.h2.receive_data(data)
        except H2Error as exc:
            # h2 has queued a GOAWAY with the error and the last stream it took: send it.
            self.fake.protocol_errors.append(f"{type(exc).__name__}: {exc}")
            self.flush()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, RequestReceived) and event.stream_id is not None:
                headers = {str(k): str(v) for k, v in event.headers or ()}
                self.incoming[event.stream_id] = _Incoming(headers=headers)
            elif isinstance(event, DataReceived) and event.stream_id is not None:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if (incoming := self.incoming.get(event.stream_id)) is not None:
                    incoming.body.extend(event.data or b"")
            elif isinstance(event, StreamEnded) and event.stream_id is not None:
                self.request_complete(event.stream_id)
            elif isinstance(event, StreamReset) and event.stream_id is not None:
                self.incoming.pop(event.stream_id, None)
                self.outgoing.pop(event.stream_id, None)
            elif isinstance(event, WindowUpdated):
                self.pump()
            elif isinstance(event, ConnectionTerminated):
                self.drop()
        self.flush()

    def request_complete(self, stream_id: int) -> None:
        incoming = self.incoming.pop(stream_id, None)
        if incoming is None:
            return
        token = incoming.headers.get(":path", "").rsplit("/", 1)[-1]
        apns_id = incoming.headers.get("apns-id", "")
        self.fake.requests.append(
            ApnsRequest(
                token=token,
                apns_id=apns_id,
                collapse_id=incoming.headers.get("apns-collapse-id"),
                headers=incoming.headers,
                body=bytes(incoming.body),
                received_at=time.monotonic(),
                connection_id=self.connection_id,
                stream_id=stream_id,
            )
        )
        reply = self.fake.reply_for(token)
        if reply.until is not None and not reply.until.is_set():
            self.timers[stream_id] = self.loop.create_task(
                self.answer_once_let_go(stream_id, apns_id, reply)
            )
        else:
            self.answer_after_latency(stream_id, apns_id, reply)

    async def answer_once_let_go(self, stream_id: int, apns_id: str, reply: ApnsReply) -> None:
        """Answer once the test lets go of the stream (cancelled with the connection)."""
        assert reply.until is not None
        await reply.until.wait()
        self.answer_after_latency(stream_id, apns_id, reply)

    def answer_after_latency(self, stream_id: int, apns_id: str, reply: ApnsReply) -> None:
        if reply.latency > 0:
            timer = self.loop.call_later(reply.latency, self.answer, stream_id, apns_id, reply)
            self.timers[stream_id] = timer
        else:
            self.answer(stream_id, apns_id, reply)

    def answer(self, stream_id: int, apns_id: str, reply: ApnsReply) -> None:
        self.timers.pop(stream_id, None)
        if reply.drop:
            self.drop()
            return
        if self.transport is None or self.transport.is_closing() or self.going_away:
            return
        if reply.refuse or reply.goaway:
            self.refuse(stream_id, goaway=reply.goaway)
            return
        headers = [(":status", str(reply.status)), ("apns-id", apns_id)]
        if reply.retry_after is not None:
            headers.append(("retry-after", str(reply.retry_after)))
        body = b""
        if reply.status != 200:
            error: dict[str, Any] = {"reason": reply.reason or f"HTTP{reply.status}"}
            if reply.status == 410:
                error["timestamp"] = int(time.time() * 1000)
            body = json.dumps(error, separators=(",", ":")).encode()
            headers.append(("content-type", "application/json"))
        try:
            self.h2.send_headers(stream_id, headers, end_stream=not body)
        except H2Error:
            return  # the client reset or closed the stream meanwhile
        if body:
            self.outgoing[stream_id] = body
            self.pump()
        if not self.flush_scheduled:  # one write for every answer due this loop turn
            self.flush_scheduled = True
            self.loop.call_soon(self.flush)

    def refuse(self, stream_id: int, *, goaway: bool) -> None:
        """RST_STREAM(REFUSED_STREAM), or GOAWAY with the previous stream as the last one."""
        try:
            if goaway:
                self.going_away = True
                self.h2.close_connection(last_stream_id=max(stream_id - 2, 0))
            else:
                self.h2.reset_stream(stream_id, error_code=ErrorCodes.REFUSED_STREAM)
        except H2Error:
            return
        self.flush()

    def pump(self) -> None:
        """Send pending bodies as far as flow control allows; the rest on WINDOW_UPDATE."""
        for stream_id, body in list(self.outgoing.items()):
            while body:
                try:
                    window = self.h2.local_flow_control_window(stream_id)
                except H2Error:
                    body = b""
                    break
                size = min(window, self.h2.max_outbound_frame_size, len(body))
                if size <= 0:
                    break
                self.h2.send_data(stream_id, body[:size], end_stream=size == len(body))
                body = body[size:]
            if body:
                self.outgoing[stream_id] = body
            else:
                del self.outgoing[stream_id]
