"""A publisher at a steady rate, in its own process: the load of the paced mode.

    python -m proving.bench.pacer AMQP_URL QUEUE RATE SECONDS SEED

Publishers are other services in production, on other machines; here this
one shares the cores with the consumer it loads, so what it spends a message
is taken from the variant being timed. It spends as little as a real client
library lets it:

1. every message (body and properties) is built before the clock starts;
2. it publishes on aiormq's channel, whose frames pamqp encodes, without
   aio-pika's per-message objects and without confirms: a publish is put on
   the connection's write queue and not waited on (`wait=False`), one after
   another, no task each;
3. every TICK_SECONDS it publishes what is due by then; at the end one round
   trip on the channel (the broker answers it only after reading every
   publish before it), then it prints how many messages it sent.

Nothing is lost unseen: the paced consumer waits for every message within a
deadline (`proving.bench.rounds`).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import cast

import aiormq
from pamqp import commands

from proving.bench.workload import job
from proving.deadlines import ANSWER_S, within

TICK_SECONDS = 0.005


def _frames(n: int, rng: random.Random) -> tuple[bytes, commands.Basic.Properties]:
    """Job `n` as aiormq publishes it: the body and the properties of `workload.job`."""
    message = job(n, rng)
    properties = commands.Basic.Properties(
        message_id=message.message_id,
        content_type=message.content_type,
        delivery_mode=int(message.delivery_mode),
        headers=dict(message.headers),
    )
    return message.body, properties


async def publish_paced(url: str, queue: str, *, rate: float, seconds: float, seed: int) -> int:
    """Publish `rate` msg/s to `queue` for `seconds`; return the count sent."""
    rng = random.Random(seed)
    connection = await within(ANSWER_S, "a connection", aiormq.connect(url))
    try:
        # aiormq's Channel: its basic_publish takes `wait` (the abstract one does not say so).
        channel = cast(
            aiormq.Channel,
            await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=False)),
        )
        total = int(rate * seconds)
        messages = [_frames(n, rng) for n in range(total)]
        started = time.perf_counter()
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - started) * rate) + 1)
            for body, properties in messages[sent:due]:
                await channel.basic_publish(
                    body, routing_key=queue, properties=properties, wait=False
                )
            sent = due
            await asyncio.sleep(TICK_SECONDS)
        await within(ANSWER_S, "the broker's read of the publishes", channel.basic_qos())
        return sent
    finally:
        await within(ANSWER_S, "the connection's close", connection.close())


def main(argv: list[str]) -> int:
    url, queue, rate, seconds, seed = argv
    sent = asyncio.run(
        publish_paced(url, queue, rate=float(rate), seconds=float(seconds), seed=int(seed))
    )
    print(sent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
