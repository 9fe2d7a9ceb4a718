"""Publish send jobs so that none is lost without a word.

A job is JSON with `message_id` set (the dedupe key: kept on every retry),
tenant in `x-tenant`, persistent delivery, sent to a queue through the default
exchange. `publish` returns only once the broker confirmed it: a job the call
reports as sent is on the broker's disk. What can go wrong, and what we do:

(a) No queue by that name: the broker would drop the job and still confirm
    it. We publish with `mandatory`, so the broker returns it instead, and
    `publish` raises `Unroutable`. Not retried: a retry would be returned too.
(b) A nack, a confirm that does not come within `confirm_timeout_s`, a
    connection or channel lost before the confirm: the outcome is unknown.
    The same message (same message_id, same body) is published again after a
    backoff with full jitter, up to `attempts` tries, then `NotConfirmed` is
    raised. A job may so reach its queue twice; the consumer's dedupe key
    absorbs the copy.
(c) One confirm at a time is slow (a round trip and an fsync each): calls run
    concurrently on one channel, up to `window` unconfirmed at once, and each
    call resolves on its own confirm. `publish_many` does that for a list.
(d) aiormq matches a returned message to its publish by message_id, so two
    publishes with the same message_id in flight on one channel could get
    each other's return: a second publish of an id waits for the first.

PublisherError            (a ConsumersError)
  Unroutable              no queue takes this routing key: fix the name or
                          declare the queue; publishing again will not help
  NotConfirmed            every try was nacked, timed out or lost its
                          connection: the job may or may not be on the
                          broker; publish it again later, same message_id
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
import structlog
from pamqp.commands import Basic

from consumers.message.decisions import ConfigurationError, ConsumersError
from consumers.message.envelope import MAX_MESSAGE_ID_BYTES, TENANT_HEADER
from consumers.telemetry.tracing import SpanKind, tracing

log = structlog.get_logger(__name__)


class PublisherError(ConsumersError):
    """Root of what `Publisher` raises about a job it could not get confirmed."""

    def __init__(self, message: str, *, queue: str, message_id: str) -> None:
        super().__init__(message)
        self.queue = queue
        self.message_id = message_id


class Unroutable(PublisherError):
    """The broker returned the job: no queue is bound to its routing key."""


class NotConfirmed(PublisherError):
    """No confirm after every try: the job may or may not be on the broker."""


# A connection or channel lost, a nack, a confirm timeout: the outcome of the
# publish is unknown, so it is tried again (same message) up to the bound.
_UNCONFIRMED = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    TimeoutError,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublisherSettings:
    window: int = 512  # publishes awaiting their confirm at once, at most
    attempts: int = 8  # tries of one job before NotConfirmed
    base_delay_s: float = 0.05  # backoff before try n+1: uniform(0, min(max, base * 2**n))
    max_delay_s: float = 5.0
    confirm_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.window < 1 or self.attempts < 1:
            raise ConfigurationError("window and attempts must be at least 1")
        if self.base_delay_s < 0 or self.max_delay_s < 0 or self.confirm_timeout_s <= 0:
            raise ConfigurationError("delays must not be negative, the timeout positive")


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One job for `publish_many`."""

    queue: str
    body: Mapping[str, Any] | bytes
    message_id: str
    tenant: str = ""
    headers: Mapping[str, Any] | None = field(default=None)


def job_message(
    body: Mapping[str, Any] | bytes,
    *,
    message_id: str,
    tenant: str = "",
    headers: Mapping[str, Any] | None = None,
) -> aio_pika.Message:
    """The AMQP message for one job (raw bytes are sent as they are)."""
    if not message_id or len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
        raise ValueError(f"message_id must be 1 to {MAX_MESSAGE_ID_BYTES} bytes")
    all_headers: dict[str, Any] = dict(headers or {})
    if tenant:
        all_headers[TENANT_HEADER] = tenant
    return aio_pika.Message(
        body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode(),
        message_id=message_id,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=all_headers or None,
    )


class Publisher:
    """Publishes jobs to queues through the default exchange of one confirm channel."""

    def __init__(
        self,
        channel: aio_pika.abc.AbstractChannel,
        settings: PublisherSettings | None = None,
    ) -> None:
        if not getattr(channel, "publisher_confirms", True):
            raise ConfigurationError("Publisher needs a channel with publisher_confirms=True")
        self._channel = channel
        self.settings = settings or PublisherSettings()
        self._window = asyncio.Semaphore(self.settings.window)
        self._by_id: dict[str, _IdTurn] = {}
        self.retried = 0  # tries after an unconfirmed one, for reports and tests

    @classmethod
    async def connect(
        cls, url: str, settings: PublisherSettings | None = None
    ) -> tuple[Publisher, aio_pika.abc.AbstractConnection]:
        """A publisher on a new robust connection (close the connection when done)."""
        connection = await aio_pika.connect_robust(url)
        channel = await connection.channel(publisher_confirms=True)
        return cls(channel, settings), connection

    async def publish(
        self,
        queue: str,
        body: Mapping[str, Any] | bytes,
        *,
        message_id: str,
        tenant: str = "",
        headers: Mapping[str, Any] | None = None,
    ) -> None:
        """Return once the broker confirmed the job; raise a PublisherError otherwise.

        With tracing on, a "publish <queue>" PRODUCER span is made, a child of the
        `traceparent` in `headers` (an outbox row's) or of the current span, and
        the message carries its context."""
        traces = tracing()
        if not traces.on:
            message = job_message(body, message_id=message_id, tenant=tenant, headers=headers)
            await self.publish_message(queue, message)
            return
        span = traces.span(
            f"publish {queue}",
            SpanKind.PRODUCER,
            parent=headers if headers and "traceparent" in headers else None,
            attributes={
                "messaging.system": "rabbitmq",
                "messaging.destination.name": queue,
                "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.message.id": message_id,
            },
        )
        assert span is not None
        traced = {**(headers or {}), **traces.headers(span)}
        try:
            message = job_message(body, message_id=message_id, tenant=tenant, headers=traced)
            await self.publish_message(queue, message)
        except BaseException as exc:
            traces.fail(span, type(exc).__name__)
            raise
        finally:
            span.end()

    async def publish_many(self, jobs: Sequence[Job]) -> list[PublisherError | None]:
        """Publish every job, `window` in flight at once; per job, None or its error."""
        results = await asyncio.gather(
            *(
                self.publish(
                    j.queue, j.body, message_id=j.message_id, tenant=j.tenant, headers=j.headers
                )
                for j in jobs
            ),
            return_exceptions=True,
        )
        outcome: list[PublisherError | None] = []
        for result in results:
            if isinstance(result, PublisherError) or result is None:
                outcome.append(result)
            else:
                raise result  # not a publishing outcome: a bug, or a cancellation
        return outcome

    async def publish_message(self, queue: str, message: aio_pika.Message) -> None:
        """Publish a prepared message, as `publish` does (also for replays from the DLQ)."""
        message_id = message.message_id or ""
        turn = self._by_id.setdefault(message_id, _IdTurn()) if message_id else None
        try:
            if turn is None:
                await self._confirmed(queue, message)
            else:
                turn.users += 1
                async with turn.lock:
                    await self._confirmed(queue, message)
        finally:
            if turn is not None:
                turn.users -= 1
                if turn.users == 0:
                    del self._by_id[message_id]

    async def _confirmed(self, queue: str, message: aio_pika.Message) -> None:
        s = self.settings
        message_id = message.message_id or ""
        for attempt in range(1, s.attempts + 1):
            async with self._window:
                error = await self._try(queue, message)
            if error is None:
                return
            if attempt == s.attempts:
                log.error(
                    "publish_not_confirmed",
                    queue=queue,
                    message_id=message_id,
                    attempts=attempt,
                    error=repr(error),
                )
                raise NotConfirmed(
                    f"job {message_id!r} to {queue!r} not confirmed after {attempt} tries:"
                    f" {error!r}",
                    queue=queue,
                    message_id=message_id,
                ) from error
            delay = random.uniform(0, min(s.max_delay_s, s.base_delay_s * 2**attempt))
            log.warning(
                "publish_retrying",
                queue=queue,
                message_id=message_id,
                attempt=attempt,
                delay_s=round(delay, 3),
                error=repr(error),
            )
            self.retried += 1
            await asyncio.sleep(delay)
            await self._reconnected()

    async def _reconnected(self) -> None:
        """Give a robust channel that is reconnecting the confirm timeout to come back."""
        ready = getattr(self._channel, "ready", None)
        if ready is None or not self._channel.is_closed:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ready(), self.settings.confirm_timeout_s)

    async def _try(self, queue: str, message: aio_pika.Message) -> BaseException | None:
        """One publish: None when confirmed, the error when the outcome is unknown."""
        try:
            # aiormq's own channel, not `Exchange.publish`: that one holds the
            # channel's lock until its frame is written, one event-loop round
            # per publish; `wait=False` releases it once the frame is queued,
            # so a batch of publishes goes out in one pass of the writer.
            channel = await self._channel.get_underlay_channel()
            queued_only = {"wait": False} if isinstance(channel, aiormq.Channel) else {}
            answer = await channel.basic_publish(
                message.body,
                exchange="",
                routing_key=queue,
                properties=message.properties,
                mandatory=True,
                timeout=self.settings.confirm_timeout_s,
                **queued_only,
            )
        except aiormq.exceptions.PublishError:  # returned, on a channel with on_return_raises
            answer = None
        except _UNCONFIRMED as exc:
            return exc
        if isinstance(answer, Basic.Ack):
            return None
        # Anything but an Ack is the broker returning the message (trap (a)).
        raise Unroutable(
            f"no queue named {queue!r}: the broker returned job {message.message_id!r}",
            queue=queue,
            message_id=message.message_id or "",
        )


class _IdTurn:
    """Publishes of one message_id take turns (trap (d) above)."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
