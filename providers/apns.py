"""APNs through aioapns, with its resend and hang traps closed.

aioapns opens the TLS connections and signs the JWT; this module owns what goes on
the wire, because aioapns' own send path can send one push twice or hang:

(a) a dropped connection: aioapns resends the in-flight requests. Here they fail
    with `UnknownOutcomeError`; nothing is ever resent (its send loop is never used).
(b) cancelling a send: aioapns later hangs or resends the connection's other
    requests. Here a send on the wire is never cancelled (shielded); on timeout the
    connection is abandoned (no new streams) and closed once its streams end.
(c) no flow-control credit: every received DATA frame is acknowledged, and a
    response body is parsed once its stream ends, however many frames it came in.
(d) `pool.close()` resends in-flight requests on a new connection. `aclose()`
    drains, then closes; a request still in flight ends as `UnknownOutcomeError`.
(e) two sends with one apns-id on one connection: answers are matched by stream
    id, never by apns-id.
(f) a burst on a new connection: aioapns hands a connection out as soon as TLS is
    up, before the server's SETTINGS say how many streams it takes (APNs sends its
    limit there, and lowers it to 1 after a failed push); streams past the limit
    end the connection, and every request on it becomes unknown. Here a
    connection takes no request before the server's first SETTINGS frame.

One `send` is one attempt: exactly one request reaches APNs, or none
(`TransientProviderError`), or the outcome is unknown (`UnknownOutcomeError`).
Streams refused (REFUSED_STREAM) or above a GOAWAY's last stream id were not
processed (RFC 9113, 8.7): transient. A request starts only if its whole timeout
fits before the caller's deadline (else `NotStartedInTime`, nothing sent).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from functools import partial
from typing import Any

import structlog
from aioapns.connection import (
    APNsBaseConnectionPool,
    APNsCertConnectionPool,
    APNsKeyConnectionPool,
    APNsTLSClientProtocol,
)
from aioapns.exceptions import ConnectionError as ApnsConnectionError
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RemoteSettingsChanged,
    ResponseReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error, NoAvailableStreamIDError

from providers.apns_h2 import ApnsH2Connection
from providers.apns_settings import PRODUCTION_HOST, SANDBOX_HOST, ApnsSettings
from providers.apns_token import ApnsToken
from providers.apns_wire import (
    PAYLOAD_TOO_LARGE,
    Answer,
    AnswerWaits,
    LastBody,
    Lost,
    NotSentError,
    Outcome,
    PendingStream,
    apns_request,
    apns_result,
    payload_limit,
    reason_of,
)
from providers.errors import (
    NotStartedInTime,
    PermanentProviderError,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.ids import SendIds
from providers.provider import NEITHER, ProviderReceipt
from providers.push import Platform, Push

__all__ = ["ApnsProvider", "ApnsSettings"]

log = structlog.get_logger(__name__)

MAX_STREAMS_PER_CONNECTION = 1000


class _ExactlyOnceProtocol(APNsTLSClientProtocol):
    """One connection: streams keyed by id, data acknowledged, nothing ever resent."""

    _last_write = 0.0  # set by aioapns' __init__ already, through refresh_inactivity_timer
    conn: ApnsH2Connection  # replaces aioapns' H2Connection in __init__
    SETTINGS_TIMEOUT = 10.0  # seconds for the server's first SETTINGS (the provider's timeout)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streams: dict[int, PendingStream] = {}
        self.abandoned = False
        self.closed = self.loop.create_future()
        self.peer_settings = asyncio.Event()  # the server's first SETTINGS: its stream limit
        # Sends waiting for flow-control credit, first in first out, each with its size.
        self.writers: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._flush_scheduled = False
        self.waits = AnswerWaits(self.loop, lambda: self.streams.values())
        self.conn = ApnsH2Connection()  # aioapns' own has h2's defaults: see providers.apns_h2
        self.stream_limit = self._read_stream_limit()  # read again on each SETTINGS

    def _read_stream_limit(self) -> int:
        return min(self.conn.remote_settings.max_concurrent_streams, MAX_STREAMS_PER_CONNECTION)

    @property
    def is_busy(self) -> bool:
        return self.abandoned or self.closed.done() or len(self.streams) >= self.stream_limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.loop.call_later(self.SETTINGS_TIMEOUT, self._settings_overdue)

    def _settings_overdue(self) -> None:
        """No SETTINGS yet: the sends waiting on it have timed out; let the pool open another."""
        if not self.peer_settings.is_set():
            log.warning("apns_settings_overdue", seconds=self.SETTINGS_TIMEOUT)
            self.close()

    @property
    def ready(self) -> bool:
        """Takes a new stream now: the server's limit is known and not reached."""
        return self.peer_settings.is_set() and not self.is_busy

    def can_write(self, size: int) -> bool:
        return size <= self._window()

    def _window(self) -> int:
        """Bytes a new stream's body may send now: the connection's credit and a stream's."""
        return min(
            self.conn.outbound_flow_control_window,
            self.conn.remote_settings.initial_window_size,
        )

    async def credit(self, size: int) -> None:
        """Until a window update leaves room for `size` bytes (or the connection closed).

        First in first out, and an update wakes only the waiters its credit has
        room for: one event set for every waiter on every WINDOW_UPDATE made
        thousands of sends wake, find no room and wait again, per update. So a
        waiter woken here starts on this connection, or hands the room on
        (`wake_writers`): nothing else wakes the waiters behind it.
        """
        turn = self.loop.create_future()
        self.writers.append((size, turn))
        try:
            await turn
        except asyncio.CancelledError:
            if not turn.done():
                self.writers.remove((size, turn))
            self.wake_writers()  # its credit, or its place at the head, goes to the next
            raise

    def wake_writers(self) -> None:
        room = self._window()
        closed = self.closed.done() or self.transport is None or self.transport.is_closing()
        while self.writers:
            size, turn = self.writers[0]
            if not closed and size > room:
                return
            self.writers.popleft()
            if not turn.done():
                turn.set_result(None)
                room -= size

    def start(
        self, headers: list[tuple[str, str]], body: bytes, *, seconds: float
    ) -> PendingStream:
        """Write one request now, with no await in between: nothing can cancel it half-way.

        Its send waits `seconds` at most for the answer (`self.waits.wait(stream)`)."""
        if not self.ready or self.transport is None or self.transport.is_closing():
            raise NotSentError("ConnectionUnavailable")
        try:
            stream_id = self.conn.get_next_available_stream_id()
        except NoAvailableStreamIDError:
            self.abandoned = True
            raise NotSentError("StreamIdsExhausted") from None
        if self.auth_provider is not None:
            headers = [*headers, ("authorization", self.auth_provider.get_header())]
        self.conn.send_headers(stream_id, headers)
        frame = self.conn.max_outbound_frame_size
        chunks = [body[i : i + frame] for i in range(0, len(body), frame)] or [b""]
        for i, chunk in enumerate(chunks):
            self.conn.send_data(stream_id, chunk, end_stream=i == len(chunks) - 1)
        stream = PendingStream(
            answer=self.loop.create_future(), deadline=self.loop.time() + seconds
        )
        self.streams[stream_id] = stream
        if not self._flush_scheduled:  # one TLS write for all requests started this loop turn
            self._flush_scheduled = True
            self.loop.call_soon(self._flush_now)
        return stream

    def abandon(self, stream: PendingStream, *, grace: float) -> None:
        """Forget `stream` (its late answer is ignored) and take no new streams; leave
        the pool at once, close when the open streams end or after `grace` seconds."""
        self.streams = {k: v for k, v in self.streams.items() if v is not stream}
        self.abandoned = True
        leave_pool, self.on_connection_lost = self.on_connection_lost, None
        if leave_pool is not None:
            leave_pool(self)
        if self.streams:
            self.loop.call_later(grace, self.close)
        else:
            self.close()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except H2Error as exc:
            log.warning("apns_protocol_error", error=str(exc))
            self.close()
            return
        for event in events:
            if isinstance(event, ResponseReceived) and event.stream_id in self.streams:
                headers = {k.decode(): v.decode() for k, v in event.headers or ()}
                self.streams[event.stream_id].headers = headers
            elif isinstance(event, DataReceived) and event.stream_id is not None:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if (stream := self.streams.get(event.stream_id)) is not None:
                    stream.body.extend(event.data or b"")
            elif isinstance(event, StreamEnded) and event.stream_id is not None:
                self._answer(event.stream_id)
            elif isinstance(event, StreamReset) and event.stream_id is not None:
                # REFUSED_STREAM: the server did not process it (RFC 9113, 8.7).
                refused = event.error_code == ErrorCodes.REFUSED_STREAM
                reason = "RefusedStream" if refused else f"StreamReset({event.error_code})"
                self._finish(event.stream_id, Lost(reason=reason, processed=not refused))
            elif isinstance(event, ConnectionTerminated):
                self._terminated(event.last_stream_id or 0)
            elif isinstance(event, WindowUpdated | RemoteSettingsChanged):
                if isinstance(event, RemoteSettingsChanged):
                    self.stream_limit = self._read_stream_limit()
                    self.peer_settings.set()
                self.wake_writers()
        self.flush()

    def flush(self) -> None:
        """Write what h2 has to send, if anything (answers read often leave nothing)."""
        if self.transport is None or self.transport.is_closing():
            return
        if data := self.conn.data_to_send():
            self.transport.write(data)
            self.refresh_inactivity_timer()

    def refresh_inactivity_timer(self) -> None:
        """Note the activity; one timer per idle period, not a new timer per write."""
        self._last_write = self.loop.time()
        if self.inactivity_timer is None:
            self.inactivity_timer = self.loop.call_later(self.INACTIVITY_TIME, self._close_if_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inactivity_timer:
            self.inactivity_timer.cancel()
        self.waits.close()  # every stream is finished below: no wait is left
        if self.on_connection_lost:
            self.on_connection_lost(self)
        for stream_id in list(self.streams):
            self._finish(stream_id, Lost(reason="ConnectionLost"))
        if not self.closed.done():
            self.closed.set_result(None)
        self.wake_writers()  # every one: they find it closed
        self.peer_settings.set()  # wakes its waiters, who then find it closed

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def _close_if_idle(self) -> None:
        self.inactivity_timer = None
        quiet = self.loop.time() - self._last_write
        if quiet < self.INACTIVITY_TIME:
            wait = self.INACTIVITY_TIME - quiet
            self.inactivity_timer = self.loop.call_later(wait, self._close_if_idle)
        elif not self.streams:
            self.close()

    def _answer(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        status = int(stream.headers.get(":status", "0"))
        self._finish(
            stream_id, Answer(status=status, headers=stream.headers, body=bytes(stream.body))
        )

    def _finish(self, stream_id: int, outcome: Outcome) -> None:
        self.conn.forget_closed(stream_id)
        stream = self.streams.pop(stream_id, None)
        if stream is not None and not stream.answer.done():
            stream.answer.set_result(outcome)
            self.waits.answered(stream)
        if self.abandoned and not self.streams:
            self.close()

    def _terminated(self, last_stream_id: int) -> None:
        """GOAWAY: streams above last_stream_id were never processed; the rest may have been."""
        self.abandoned = True
        for stream_id in [s for s in self.streams if s > last_stream_id]:
            self._finish(stream_id, Lost(reason="GoAway", processed=False))
        self.close()


class ApnsProvider:
    """Sends iOS pushes to APNs over HTTP/2, one request per attempt, never resent."""

    name = "apns"
    recovery = NEITHER  # the apns-collapse-id is the backstop

    def __init__(self, settings: ApnsSettings) -> None:
        has_key = bool(settings.key and settings.key_id and settings.team_id)
        if has_key == bool(settings.cert_file):
            raise ValueError("ApnsSettings needs either key, key_id and team_id, or cert_file")
        self.settings = settings
        self.answer_seconds = settings.timeout_seconds
        self.token: ApnsToken | None = None
        if has_key:
            assert settings.key is not None and settings.key_id is not None
            assert settings.team_id is not None
            self.token = ApnsToken(
                key=settings.key,
                key_id=settings.key_id,
                team_id=settings.team_id,
                refresh_seconds=settings.token_refresh_seconds,
            )
        self._pool: APNsBaseConnectionPool | None = None
        self._closing = False
        self._abandoned: set[_ExactlyOnceProtocol] = set()
        self._bodies = LastBody()

    @property
    def quota_name(self) -> str:
        """The quota its sends count against (APNs throttles by topic): `apns:<topic>`."""
        return f"apns:{self.settings.topic}"

    @property
    def max_in_flight(self) -> int:
        """Streams on every connection the pool may open, at the server's limit once known
        (one per connection before the first SETTINGS say it)."""
        limits = [
            c.stream_limit
            for c in (self._pool.connections if self._pool is not None else ())
            if isinstance(c, _ExactlyOnceProtocol) and c.peer_settings.is_set()
        ]
        return self.settings.max_connections * max(limits, default=1)

    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        if push.target.platform is not Platform.IOS:
            raise PermanentProviderError("UnsupportedPlatform", provider=self.name)
        host, topic, body = self._host(), self.settings.topic, self._bodies.of(push)
        if len(body) > payload_limit(push.effective_push_type):
            # What APNs would answer (413), without a request: such a body can
            # also be larger than a connection's flow-control window, and would
            # wait at the head of its line for credit that never comes.
            raise PermanentProviderError(PAYLOAD_TOO_LARGE, provider=self.name)
        headers, body = apns_request(push, ids, host=host, topic=topic, body=body)
        loop = asyncio.get_running_loop()
        timeout = self.settings.timeout_seconds
        start_by = loop.time() + timeout  # waiting for a connection: one timeout at most
        if deadline is not None:
            start_by = min(start_by, deadline - timeout)
        connection = self._ready_connection(len(body))
        if connection is None:
            try:
                async with asyncio.timeout_at(start_by):
                    connection = await self._writable_connection(len(body))
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline - timeout:
                    raise NotStartedInTime("DeadlineBeforeStart", provider=self.name) from None
                raise TransientProviderError("NoConnectionAvailable", provider=self.name) from None
        if loop.time() > start_by:
            connection.wake_writers()  # the room it may have been woken for goes to the next
            raise NotStartedInTime("DeadlineBeforeStart", provider=self.name)
        try:
            stream = connection.start(headers, body, seconds=timeout)
        except NotSentError as exc:
            connection.wake_writers()
            raise TransientProviderError(exc.reason, provider=self.name) from exc
        if not await connection.waits.wait(stream):
            connection.abandon(stream, grace=self.settings.timeout_seconds)
            self._abandoned.add(connection)
            connection.closed.add_done_callback(lambda _: self._abandoned.discard(connection))
            raise UnknownOutcomeError("Timeout", provider=self.name)
        outcome = stream.answer.result()
        if isinstance(outcome, Answer) and outcome.status == 403 and self.token is not None:
            self.token.refused(reason_of(outcome.body))
        return apns_result(outcome, sent_apns_id=ids.effect_id, provider=self.name)

    async def aclose(self) -> None:
        """Stop taking sends, let in-flight ones finish (up to the timeout), close connections."""
        self._closing = True
        pool, self._pool = self._pool, None
        if pool is None:
            return
        connections = [c for c in pool.connections if isinstance(c, _ExactlyOnceProtocol)]
        connections += self._abandoned
        pending = [s.answer for c in connections for s in c.streams.values()]
        if pending:
            await asyncio.wait(pending, timeout=self.settings.timeout_seconds)
        for connection in connections:
            connection.close()
        if connections:
            _, stuck = await asyncio.wait([c.closed for c in connections], timeout=1.0)
            for connection in connections:
                if connection.closed in stuck and connection.transport is not None:
                    connection.transport.abort()

    def _ready_connection(self, size: int) -> _ExactlyOnceProtocol | None:
        """A pooled connection that takes this request now, if any: no await, no timer."""
        if self._closing or self._pool is None:
            return None
        for connection in self._pool.connections:
            if (
                isinstance(connection, _ExactlyOnceProtocol)
                and connection.ready
                and not connection.writers  # those waiting for credit go first
                and connection.can_write(size)
            ):
                return connection
        return None

    async def _writable_connection(self, size: int) -> _ExactlyOnceProtocol:
        while True:
            if self._closing:
                raise TransientProviderError("ProviderClosed", provider=self.name)
            try:
                connection = await self._connection_pool().acquire()
            except ApnsConnectionError as exc:
                raise TransientProviderError("ConnectFailed", provider=self.name) from exc
            assert isinstance(connection, _ExactlyOnceProtocol)
            if self._closing:
                connection.close()
                continue
            if not connection.peer_settings.is_set():
                await connection.peer_settings.wait()
                continue  # its limit known now: it may be full already
            if connection.can_write(size):
                return connection
            await connection.credit(size)
            # Woken with room kept for it here: it starts here. Back in the pool it
            # could be handed another connection, and then the room kept here woke
            # no one: the sends still in line here waited for a WINDOW_UPDATE that
            # nothing in flight would bring.
            if connection.ready and connection.can_write(size):
                return connection
            connection.wake_writers()  # full or closing: the room goes to the next in line

    def _host(self) -> str:
        if self.settings.host is not None:
            return self.settings.host
        return SANDBOX_HOST if self.settings.use_sandbox else PRODUCTION_HOST

    def _connection_pool(self) -> APNsBaseConnectionPool:
        """Made on first use, inside the running loop (aioapns binds the loop at creation)."""
        if self._pool is not None:
            return self._pool
        s = self.settings
        context = s.ssl_context or ssl.create_default_context(cafile=s.ca_file)
        context.set_alpn_protocols(["h2"])
        pool: APNsBaseConnectionPool
        if s.cert_file is not None:
            pool = APNsCertConnectionPool(
                cert_file=s.cert_file,
                topic=s.topic,
                max_connections=s.max_connections,
                use_sandbox=s.use_sandbox,
                ssl_context=context,
            )
        else:
            assert s.key is not None and s.key_id is not None and s.team_id is not None
            assert self.token is not None
            pool = _SharedTokenPool(
                key=s.key,
                key_id=s.key_id,
                team_id=s.team_id,
                topic=s.topic,
                max_connections=s.max_connections,
                use_sandbox=s.use_sandbox,
                ssl_context=context,
            )
            pool.token = self.token
        # aioapns connects to the protocol class' APNS_SERVER/APNS_PORT: a class per provider.
        pool.protocol_class = type(
            "ApnsConnection",
            (_ExactlyOnceProtocol,),
            {
                "APNS_SERVER": self._host(),
                "APNS_PORT": s.port,
                "SETTINGS_TIMEOUT": s.timeout_seconds,
            },
        )
        self._pool = pool
        return pool


class _SharedTokenPool(APNsKeyConnectionPool):
    """aioapns' key pool, every connection signing with the provider's one token."""

    token: ApnsToken

    async def create_connection(self) -> Any:
        protocol: Any = self.protocol_class  # aioapns' annotations are narrower than its use
        factory = partial(protocol, self.apns_topic, self.loop, self.discard_connection, self.token)
        return await self._create_connection(factory)
