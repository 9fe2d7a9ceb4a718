"""`idempotent-workers dlq list|replay QUEUE`: look at dead letters, send them back.

`list` reads up to `limit` dead letters without removing them (they are
returned to the queue when the channel closes). `replay` republishes each to
its work queue with a fresh attempt count, confirmed, and only then removes
it from the dead-letter queue; its message_id is kept, so a replay of a job
that did commit is acked as a duplicate, never run twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import aio_pika

from consumers.dispatch import ERROR_HEADER, QUEUE_HEADER
from consumers.envelope import ATTEMPT_HEADER, REASON_HEADER
from consumers.retry import dead_letter_queue
from consumers.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    message_id: str | None
    reason: str
    attempt: int
    error: str
    size: int


def _describe(message: aio_pika.abc.AbstractIncomingMessage) -> DeadLetter:
    headers = message.headers or {}
    death = headers.get("x-death")
    reason = str(headers.get(REASON_HEADER, ""))
    if not reason and isinstance(death, list) and death:  # dead-lettered by the broker
        first = death[0]
        reason = f"broker:{first.get('reason', '?')!s}" if isinstance(first, dict) else "broker"
    attempt = headers.get(ATTEMPT_HEADER, 1)
    return DeadLetter(
        message_id=message.message_id,
        reason=reason or "unknown",
        attempt=attempt if isinstance(attempt, int) else 1,
        error=str(headers.get(ERROR_HEADER, "")),
        size=len(message.body),
    )


async def list_dead_letters(url: str, queue: str, limit: int) -> list[DeadLetter]:
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        dlq = await channel.get_queue(dead_letter_queue(queue), ensure=True)
        found: list[DeadLetter] = []
        while len(found) < limit:
            message = await dlq.get(no_ack=False, fail=False)
            if message is None:
                break
            found.append(_describe(message))
        return found  # closing the channel returns every message unacked
    finally:
        await connection.close()


async def replay_dead_letters(url: str, queue: str, limit: int) -> int:
    connection = await aio_pika.connect(url)
    replayed = 0
    try:
        channel = await connection.channel(publisher_confirms=True)
        dlq = await channel.get_queue(dead_letter_queue(queue), ensure=True)
        while replayed < limit:
            message = await dlq.get(no_ack=False, fail=False)
            if message is None:
                break
            headers = dict(message.headers or {})
            target = str(headers.pop(QUEUE_HEADER, queue))
            for name in (REASON_HEADER, ERROR_HEADER, ATTEMPT_HEADER, "x-death"):
                headers.pop(name, None)
            await channel.default_exchange.publish(
                aio_pika.Message(
                    message.body,
                    headers=headers,
                    content_type=message.content_type,
                    message_id=message.message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=target,
            )
            await message.ack()  # only after the broker confirmed the replay
            replayed += 1
    finally:
        await connection.close()
    return replayed


async def run_dlq(settings: Settings, action: str, queue: str, *, limit: int) -> int:
    if action == "list":
        letters = await list_dead_letters(settings.amqp.url, queue, limit)
        print(f"{'message_id':<40} {'reason':<36} {'attempt':>7} error")
        for letter in letters:
            print(
                f"{letter.message_id or '-':<40} {letter.reason:<36} {letter.attempt:>7}"
                f" {letter.error[:60]}"
            )
        print(f"dlq: queue={dead_letter_queue(queue)} listed={len(letters)}")
        return 0
    replayed = await replay_dead_letters(settings.amqp.url, queue, limit)
    print(f"dlq: queue={dead_letter_queue(queue)} replayed={replayed}")
    return 0
