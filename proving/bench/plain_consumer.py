"""The `bare` variant's consumer: aio-pika as its documentation shows, and nothing of ours.

    python -I proving/bench/plain_consumer.py AMQP_URL QUEUE PREFETCH COUNT

A robust connection, a channel with `set_qos(prefetch_count=PREFETCH)`, and
`queue.consume()` with a plain callback that acks `multiple=True` every
PREFETCH // 2 messages (and the last one), so one ack covers half a window.
It consumes COUNT messages, closes and prints `acked=COUNT peak_mb=M`. There
is no clock in here: the bench times this process from outside, by the
queue's depth (`proving.bench.untimed`). Run with `-I`, it imports only
aio-pika and the standard library, so no instrument of the bench process
(`proving.bench.stopwatch`) can reach it; and no deadline of ours either:
the bench bounds this process from outside (`proving.bench.untimed`).
"""

from __future__ import annotations

import asyncio
import resource
import sys

import aio_pika


async def consume(url: str, queue_name: str, prefetch: int, count: int) -> int:
    """Consume and ack `count` messages of `queue_name`; return how many were acked."""
    ack_every = max(1, prefetch // 2)
    received = 0
    done = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal received
        received += 1
        if received % ack_every == 0 or received == count:
            await message.ack(multiple=True)  # unbounded: the bench's child, bounded from outside
        if received == count:
            done.set()

    connection = await aio_pika.connect_robust(
        url
    )  # unbounded: the bench's child, bounded from outside
    async with connection:
        channel = await connection.channel()  # unbounded: the bench's child, bounded from outside
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(queue_name, ensure=False)
        await queue.consume(on_message)  # unbounded: the bench's child, bounded from outside
        await done.wait()  # unbounded: the bench's child, bounded from outside
    return received


def main(argv: list[str]) -> int:
    url, queue_name, prefetch, count = argv[0], argv[1], int(argv[2]), int(argv[3])
    acked = asyncio.run(consume(url, queue_name, prefetch, count))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kilobytes
    print(f"acked={acked} peak_mb={peak_mb:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
