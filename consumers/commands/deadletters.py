"""Dead letters as the CLI sees them: read without removing, described, dated.

Reading a queue without taking messages away does not exist in AMQP 0-9-1 for
a quorum queue. `read_dead_letters()` comes closest: a consumer that never
acks takes up to `most` messages, and closing its channel gives them all back
in their places. What that costs, measured on RabbitMQ 3.10: the broker
counts every return as a delivery, so each read raises each message's
`x-delivery-count` by one (a `basic.get` that is never acked, or one
followed by `nack(requeue=True)`, costs the same one). Our dead-letter
queues have no delivery limit on RabbitMQ 3.x, so the count is only a number
there; RabbitMQ 4.x gives quorum queues a default limit of 20 (the README
says what to set).

When a message was first dead-lettered travels with it, in
`x-dead-lettered-at` (epoch milliseconds, the earliest ever set: a replayed
message that fails again keeps its first date), so a replay can tell whether
its claim may already have been deleted by retention.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika

from consumers.broker.headers import read_leniently
from consumers.commands.printable import printable
from consumers.message.envelope import (
    ATTEMPT_HEADER,
    NO_MESSAGE_ID_HEADER,
    REASON_HEADER,
    TENANT_HEADER,
    is_text,
)
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER, ERROR_HEADER

DLQ_SUFFIX = ".dlq"

Message = aio_pika.abc.AbstractIncomingMessage


class NoSuchQueue(Exception):
    """The named queue does not exist on the broker."""


def work_queue_of(name: str) -> str:
    """The work queue a DLQ belongs to: `orders.dlq` and `orders` both give `orders`."""
    return name.removesuffix(DLQ_SUFFIX) if name.endswith(DLQ_SUFFIX) else name


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    message: Message
    message_id: str | None  # None: the message has no usable id
    tenant: str  # the x-tenant header as text; "" when there is none
    reason: str
    attempt: int
    error: str
    dead_lettered_at: datetime.datetime | None  # None: nothing in the message tells

    def age(self, now: datetime.datetime) -> datetime.timedelta | None:
        return None if self.dead_lettered_at is None else now - self.dead_lettered_at

    @property
    def digest(self) -> str:
        """A name for this dead letter that needs no message_id: 16 hex digits of the
        SHA-256 of its body, message_id property and headers (less `x-delivery-count`,
        which each read raises). The same from one read to the next; copies alike share it.
        """
        headers = sorted((self.message.headers or {}).items())
        kept = [(name, value) for name, value in headers if name != "x-delivery-count"]
        seen = repr((self.message.message_id, kept)).encode("utf-8", "surrogateescape")
        return hashlib.sha256(seen + b"\0" + self.message.body).hexdigest()[:16]

    def is_named(self, wanted: str) -> bool:
        """Whether `wanted` is this letter's message_id, raw or as `dlq list` prints it.

        An id holding NUL or an escape sequence cannot be typed, nor one that is
        not UTF-8 (printed `-`, as a missing one is): the printed form can.
        """
        return self.message_id == wanted or printable(self.message_id) == wanted


def describe(message: Message) -> DeadLetter:
    headers = message.headers or {}
    reason = _text(headers.get(REASON_HEADER))
    death = headers.get("x-death")
    if not reason and isinstance(death, list) and death:  # dead-lettered by the broker
        first = death[0]
        reason = f"broker:{_text(first.get('reason')) or '?'}" if isinstance(first, dict) else ""
    attempt = headers.get(ATTEMPT_HEADER, 1)
    return DeadLetter(
        message=message,
        message_id=None if headers.get(NO_MESSAGE_ID_HEADER) else message.message_id,
        tenant=_text(headers.get(TENANT_HEADER)),
        reason=reason or "unknown",
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1,
        error=_text(headers.get(ERROR_HEADER)),
        dead_lettered_at=_first_dated(message, headers),
    )


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "surrogateescape")
    return str(value)


def _first_dated(message: Message, headers: Mapping[str, Any]) -> datetime.datetime | None:
    """The earliest of our dead-letter stamp, the broker's x-death times, the timestamp."""
    seen: list[datetime.datetime] = []
    stamp = headers.get(DEAD_LETTERED_AT_HEADER)
    if isinstance(stamp, int) and not isinstance(stamp, bool) and stamp > 0:
        seen.append(datetime.datetime.fromtimestamp(stamp / 1000, datetime.UTC))
    death = headers.get("x-death")
    if isinstance(death, list):
        seen.extend(
            _aware(d["time"]) for d in death if isinstance(d, dict) and _is_time(d.get("time"))
        )
    if _is_time(message.timestamp):
        seen.append(_aware(message.timestamp))
    return min(seen, default=None)


def _is_time(value: object) -> bool:
    return isinstance(value, datetime.datetime)


def _aware(moment: Any) -> datetime.datetime:
    assert isinstance(moment, datetime.datetime)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def undecodable_header(headers: Mapping[str, Any], prefix: str = "") -> str | None:
    """The name of the first header whose name or text is not UTF-8, or None."""
    for name, value in headers.items():
        path = f"{prefix}{name}"
        if not is_text(name) or _undecodable(value):
            return path
        if isinstance(value, Mapping) and (inner := undecodable_header(value, f"{path}.")):
            return inner
        if isinstance(value, list):
            for index, item in enumerate(value):
                if _undecodable(item):
                    return f"{path}[{index}]"
                if isinstance(item, Mapping) and (
                    inner := undecodable_header(item, f"{path}[{index}].")
                ):
                    return inner
    return None


def _undecodable(value: object) -> bool:
    # pamqp hands back a long string it cannot decode as bytes; read_leniently
    # leaves a short one with lone surrogates.
    return isinstance(value, bytes) or (isinstance(value, str) and not is_text(value))


async def read_dead_letters(
    channel: aio_pika.abc.AbstractChannel, dlq: str, *, most: int, idle_seconds: float = 2.0
) -> tuple[list[DeadLetter], int]:
    """Up to `most` messages of `dlq`, unacked, and how many it held.

    Closing `channel` gives them back to the queue. A property or header
    name that is not UTF-8 is read as lone surrogates (`consumers.broker.headers`)
    rather than costing the connection, so one such message cannot stop
    every later read at itself.
    """
    read_leniently()
    try:
        queue = await channel.declare_queue(dlq, passive=True)
    except aio_pika.exceptions.ChannelNotFoundEntity as exc:
        raise NoSuchQueue(dlq) from exc
    held = queue.declaration_result.message_count or 0
    wanted = min(held, most)
    if wanted == 0:
        return [], held
    arrived: asyncio.Queue[Message] = asyncio.Queue()

    async def take(message: Message) -> None:
        arrived.put_nowait(message)

    await channel.set_qos(prefetch_count=wanted)
    tag = await queue.consume(take, no_ack=False)
    found: list[DeadLetter] = []
    try:
        while len(found) < wanted:
            try:
                message = await asyncio.wait_for(arrived.get(), idle_seconds)
            except TimeoutError:  # another client took some since we counted
                break
            found.append(describe(message))
    finally:
        await queue.cancel(tag)
    return found, held
