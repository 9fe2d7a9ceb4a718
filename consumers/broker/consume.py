"""Deliveries straight from aiormq's frames, consumers kept by aio-pika's recovery.

aio-pika hands a delivery to a consumer in three steps: aiormq reads the
frames into a `DeliveredMessage` and starts a task for it; aio-pika's
consumer coroutine builds an `IncomingMessage` (every property set through
a checking `__setattr__`, expiration and timestamp converted); a second task
runs the callback. A worker's batch loop only appends the delivery to its
buffer, so both tasks and most of the object are overhead on every
message. Here:

1. `RawDelivery` is the delivery built from aiormq's `DeliveredMessage`: the
   body, the properties decoding and republishing read, the tag and the
   channel, in a slotted object; `ack` and `nack` are aiormq's frames
   (parsed and written by pamqp and aiormq: nothing of AMQP is encoded here).
2. `DirectConsumer(on_delivery)` is the consumer: `on_delivery` is called
   synchronously with the `RawDelivery`, in the channel's own frame reader
   (`deliver_inline`), as soon as aiormq has read the delivery's content. No
   task per delivery, no `IncomingMessage`; and the deliveries of a channel
   reach it in the order of their tags, which a batch's `multiple=True` ack
   relies on (`consumers.pipeline.settle`).
3. `DirectQueue.consume` switches the channel's reader to (2.) before it
   sends `basic.consume` (a backlog is delivered while ConsumeOk is on its
   way), registers a `DirectConsumer` on the underlying aiormq
   channel and records it where `aio_pika.RobustQueue` records its own
   consumers, so recovery keeps it: after a reconnect the restored queue
   consumes again through this `consume`; a broker's `basic.cancel` for it
   requests recovery as for aio-pika's consumers.
4. aio-pika's recovery of a consumer missing after a restore registers it
   through the base `Queue.consume`: its deliveries then come as aio-pika's
   `IncomingMessage`, which `DirectConsumer` hands on as it is (both are a
   `Delivery`).

`DirectChannel` is the robust channel whose queues are `DirectQueue`s;
`consumers.broker.connection.ClusterConnection` opens its channels with it.
Any other callback consumes through aio-pika, unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol, cast

import aio_pika
import aiormq
import structlog
from aio_pika.abc import AbstractIncomingMessage, ConsumerTag, HeadersType
from aio_pika.exceptions import ChannelInvalidStateError, MessageProcessError
from aiormq.abc import DeliveredMessage
from pamqp import commands
from pamqp.common import Arguments
from pamqp.header import ContentHeader

from consumers.message.envelope import Incoming

log = structlog.get_logger(__name__)


class Delivery(Incoming, Protocol):
    """One delivery as the batch loop settles it: `RawDelivery` or aio-pika's `IncomingMessage`."""

    @property
    def correlation_id(self) -> str | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def delivery_tag(self) -> int | None: ...
    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        """The channel it came on; raises ChannelInvalidStateError once that has closed."""
        ...

    async def ack(self, multiple: bool = False) -> None: ...
    async def nack(self, multiple: bool = False, requeue: bool = True) -> None: ...


class RawDelivery:
    """A delivery read from aiormq's frames (1.): what the worker reads of it, no more."""

    __slots__ = (
        "_channel",
        "_settled",
        "body",
        "content_encoding",
        "content_type",
        "correlation_id",
        "delivery_tag",
        "headers",
        "message_id",
        "redelivered",
        "type",
    )

    def __init__(self, message: DeliveredMessage) -> None:
        properties = message.header.properties
        self._channel = message.channel
        self._settled = False
        self.body: bytes = message.body
        self.headers: HeadersType = properties.headers or {}
        self.content_type: str | None = properties.content_type
        self.content_encoding: str | None = properties.content_encoding
        self.message_id: str | None = properties.message_id
        self.correlation_id: str | None = properties.correlation_id
        self.type: str | None = properties.message_type
        self.delivery_tag: int | None = message.delivery_tag
        self.redelivered: bool | None = message.redelivered

    @property
    def channel(self) -> aiormq.abc.AbstractChannel:
        if self._channel.is_closed:
            raise ChannelInvalidStateError
        return self._channel

    def _settle(self) -> int:
        """The tag to ack or nack; a second settle raises, as aio-pika's does."""
        if self._settled:
            raise MessageProcessError("Message already processed", self)
        self._settled = True
        return self.delivery_tag or 0

    async def ack(self, multiple: bool = False) -> None:
        channel = self.channel
        await channel.basic_ack(delivery_tag=self._settle(), multiple=multiple)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        channel = self.channel
        await channel.basic_nack(delivery_tag=self._settle(), multiple=multiple, requeue=requeue)


class DirectConsumer:
    """A consumer callback that hands each delivery to `on_delivery` (2. and 4.).

    A delivery `on_delivery` raised on is in no buffer: skipped, a batch's
    multiple ack at a later tag of its channel would settle it unprocessed.
    `_hand_back` returns it to the broker instead (`basic.reject`, requeued),
    before the caller hands over anything after it, so the reject is queued
    ahead of every later ack; the broker redelivers it, its delivery-limit
    counting each return. Every path a delivery takes here goes through it.
    """

    __slots__ = ("on_delivery",)

    def __init__(self, on_delivery: Callable[[Delivery], None]) -> None:
        self.on_delivery = on_delivery

    def took(self, delivery: Delivery) -> bool:
        """`on_delivery(delivery)`; False (logged) if it raised: then `_hand_back` it."""
        try:
            self.on_delivery(delivery)
        except Exception:
            log.exception("consumer_callback_failed", delivery_tag=delivery.delivery_tag)
            return False
        return True

    async def hand_over(self, delivery: Delivery) -> None:
        """`on_delivery(delivery)`, or, if it raised, the delivery handed back to the broker."""
        if not self.took(delivery):
            await _hand_back(delivery)

    async def deliver(self, message: DeliveredMessage) -> None:
        """aiormq's consumer callback, as registered: `deliver_inline` hands the
        delivery over itself instead, without the task aiormq would start for this."""
        await self.hand_over(RawDelivery(message))

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        """aio-pika's: a consumer aio-pika restored through its own `Queue.consume`."""
        await self.hand_over(message)


async def _hand_back(delivery: Delivery) -> None:
    """Return a delivery no batch holds to the broker (requeued), not waiting for the write."""
    try:
        await delivery.channel.basic_reject(delivery.delivery_tag or 0, wait=False)
    except Exception as exc:  # the channel closed: the broker takes it back anyway
        log.warning("reject_failed", delivery_tag=delivery.delivery_tag, error=repr(exc))


class DirectQueue(aio_pika.RobustQueue):
    """A robust queue that consumes a `DirectConsumer` below aio-pika's objects (3.)."""

    async def consume(
        self,
        callback: Callable[[AbstractIncomingMessage], Awaitable[Any]],
        no_ack: bool = False,
        exclusive: bool = False,
        arguments: Arguments = None,
        consumer_tag: ConsumerTag | None = None,
        timeout: aio_pika.abc.TimeoutType = None,  # noqa: ASYNC109 -- aio-pika's signature
        robust: bool = True,
    ) -> ConsumerTag:
        if not isinstance(callback, DirectConsumer) or no_ack:
            return await super().consume(
                callback,
                no_ack=no_ack,
                exclusive=exclusive,
                arguments=arguments,
                consumer_tag=consumer_tag,
                timeout=timeout,
                robust=robust,
            )
        channel = await self.channel.get_underlay_channel()
        # Before basic.consume, never after: the broker starts delivering a
        # backlog while ConsumeOk is on its way, and a delivery aiormq was
        # still reading when the reader changed would reach `on_delivery`
        # (in its task) after later ones had (inline). A batch's multiple ack
        # would then settle it unprocessed. Installed first, every delivery of
        # the consumer takes the one path, in the order of its tags.
        deliver_inline(cast(aiormq.Channel, channel))
        result = await channel.basic_consume(
            queue=self.name,
            consumer_callback=callback.deliver,
            exclusive=exclusive,
            arguments=arguments,
            consumer_tag=consumer_tag,
            timeout=timeout,
        )
        tag = result.consumer_tag
        if tag is None:
            raise RuntimeError("the broker's ConsumeOk carried no consumer tag")
        if robust:
            # Where RobustQueue keeps its own consumers (its restore, and the
            # channel's cancel handling, read them): so ours are kept alike.
            self._consumers[tag] = dict(
                callback=callback, no_ack=False, exclusive=exclusive, arguments=arguments
            )
        return tag


def deliver_inline(channel: aiormq.Channel) -> None:
    """Hand the channel's deliveries to its `DirectConsumer`s in its frame reader (2.).

    aiormq's reader reads a delivery's content frames, then starts a task per
    delivery for the consumer's coroutine (about 5 us a message here, with
    aiormq's task bookkeeping). A `DirectConsumer` only appends to a buffer:
    this channel's `_on_deliver_frame`, which aiormq's reader looks up on the
    channel for every delivery, becomes `_on_deliver_frame_inline` below, which
    reads the content as aiormq's does (`_get_frame`, `_read_content`) and calls
    `on_delivery` at once. Any other consumer of the channel is run as aiormq
    runs it. The reader task of a channel whose connection is replaced is gone
    with it: a restored queue's `consume` installs this on the new channel.
    """
    if "_on_deliver_frame" in vars(channel):
        return
    channel._on_deliver_frame = partial(_on_deliver_frame_inline, channel)  # type: ignore[method-assign]


async def _on_deliver_frame_inline(channel: aiormq.Channel, frame: commands.Basic.Deliver) -> None:
    """aiormq's `Channel._on_deliver_frame`, but a `DirectConsumer` runs inline."""
    header = await channel._get_frame()
    if not isinstance(header, ContentHeader):
        raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader", header)
    message = await channel._read_content(frame, header)
    if frame.consumer_tag is None:
        log.warning("delivery_without_consumer_tag", delivery_tag=frame.delivery_tag)
        return
    consumer = channel.consumers.get(frame.consumer_tag)
    if consumer is None:
        return
    direct = getattr(consumer, "__self__", None)
    if not isinstance(direct, DirectConsumer):
        task = channel.create_task(consumer(message))
        task.add_done_callback(channel._on_consumer_done)
        return
    delivery = RawDelivery(message)
    if not direct.took(delivery):  # the reader hands over nothing after it before this
        await _hand_back(delivery)


class DirectChannel(aio_pika.RobustChannel):
    """A robust channel whose declared queues are `DirectQueue`s."""

    QUEUE_CLASS = DirectQueue
