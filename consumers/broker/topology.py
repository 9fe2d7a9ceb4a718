"""The queues a worker declares for each handler.

    <queue>                  work queue (quorum by default, with a delivery-limit
                             that dead-letters a message that keeps killing workers)
    <queue>.retry.<ms>       one per delay tier: message TTL <ms>, dead-letters back
                             to <queue> through the default exchange
    <queue>.dlq              dead letters, each with an `x-reason` header
    <queue>.bulk             an effects queue's bulk lane: the parts of sends of many
                             targets (`consumers.publishing.parts`); a work queue like
                             <queue> (its retries come back to <queue>)

Publishers send to the default exchange with the queue's name as routing key.
Declaring is idempotent; declaring with other arguments than an existing
queue has is refused by the broker (PRECONDITION_FAILED): the worker checks
every queue first (`consumers.broker.conflicts`), and a refusal here still is
a `TopologyConflict`, never a failure to retry.
"""

from __future__ import annotations

from typing import Any

import aio_pika
import aiormq

from consumers.broker.conflicts import QueueDeclaration, TopologyConflict
from consumers.handlers.retry import RetryPolicy, bulk_lane, dead_letter_queue, tier_queue
from consumers.settings import AmqpSettings, QueueType


def _type_args(settings: AmqpSettings) -> dict[str, Any]:
    return {"x-queue-type": str(settings.queue_type)}


def work_queue_arguments(queue: str, settings: AmqpSettings) -> dict[str, Any]:
    args = _type_args(settings)
    args["x-dead-letter-exchange"] = ""
    args["x-dead-letter-routing-key"] = dead_letter_queue(queue)
    if settings.queue_type is QueueType.QUORUM:
        args["x-delivery-limit"] = settings.delivery_limit
    return args


def tier_arguments(queue: str, tier_seconds: float, settings: AmqpSettings) -> dict[str, Any]:
    args = _type_args(settings)
    args["x-message-ttl"] = round(tier_seconds * 1000)
    args["x-dead-letter-exchange"] = ""
    args["x-dead-letter-routing-key"] = queue
    if settings.queue_type is QueueType.QUORUM:
        # Expired messages move back at least once: a broker restart mid-move
        # repeats the move rather than losing the message.
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    return args


def declarations(
    queue: str, retry: RetryPolicy, settings: AmqpSettings, *, bulk: bool = False
) -> list[QueueDeclaration]:
    """The queues of one handler, in the order `declare` makes them: dead letters, tiers,
    the bulk lane (`bulk`: an effects queue's), work."""
    lanes = [bulk_lane(queue)] if bulk else []
    return [
        QueueDeclaration(name=dead_letter_queue(queue), arguments=_type_args(settings)),
        *(
            QueueDeclaration(
                name=tier_queue(queue, tier), arguments=tier_arguments(queue, tier, settings)
            )
            for tier in retry.tiers_seconds
        ),
        *(
            QueueDeclaration(name=lane, arguments=work_queue_arguments(queue, settings))
            for lane in lanes
        ),
        QueueDeclaration(name=queue, arguments=work_queue_arguments(queue, settings)),
    ]


async def declare(
    channel: aio_pika.abc.AbstractChannel,
    queue: str,
    retry: RetryPolicy,
    settings: AmqpSettings,
    *,
    bulk: bool = False,
) -> aio_pika.abc.AbstractQueue:
    """Declare the work queue, its retry tiers, its dead-letter queue and (`bulk`) its bulk
    lane; return the work queue."""
    declared: aio_pika.abc.AbstractQueue | None = None
    for declaration in declarations(queue, retry, settings, bulk=bulk):
        try:
            declared = await channel.declare_queue(
                declaration.name, durable=declaration.durable, arguments=dict(declaration.arguments)
            )
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            # Declared otherwise since the check (or never checked): the same conflict.
            refused = str(exc.args[0]) if exc.args else str(exc)
            raise TopologyConflict(declaration, refused, {}) from exc
    assert declared is not None
    return declared


async def delete(channel: aio_pika.abc.AbstractChannel, queue: str, retry: RetryPolicy) -> None:
    """Delete every queue `declare` made (tests and the demo clean up with it)."""
    for name in [
        queue,
        bulk_lane(queue),
        dead_letter_queue(queue),
        *(tier_queue(queue, t) for t in retry.tiers_seconds),
    ]:
        await channel.queue_delete(name)
