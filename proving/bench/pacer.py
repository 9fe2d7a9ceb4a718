"""A publisher at a steady rate, in its own process: the load of the paced mode.

    python -m proving.bench.pacer AMQP_URL QUEUE RATE SECONDS SEED

Publishers are other services in production; running this one in its own
process keeps its CPU out of the consumer's process (on a 2-core machine it
still takes about 0.6 of a core at 1,500 msg/s, so the paced latencies of every
variant include that contention). It builds every message before the clock
starts (building one costs about a fifth of publishing it), publishes every
5 ms what is due by then (confirmed), and prints how many messages it sent.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

import aio_pika

from proving.bench.workload import job
from proving.deadlines import ANSWER_S, within

TICK_SECONDS = 0.005


async def publish_paced(url: str, queue: str, *, rate: float, seconds: float, seed: int) -> int:
    """Publish `rate` msg/s to `queue` for `seconds`; return the count sent."""
    rng = random.Random(seed)
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        exchange = channel.default_exchange
        total = int(rate * seconds)
        messages = [job(n, rng) for n in range(total)]
        started = time.perf_counter()
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - started) * rate) + 1)
            if due > sent:
                await asyncio.gather(
                    *(exchange.publish(messages[n], routing_key=queue) for n in range(sent, due))
                )
                sent = due
            await asyncio.sleep(TICK_SECONDS)
        return sent
    finally:
        await connection.close()


def main(argv: list[str]) -> int:
    url, queue, rate, seconds, seed = argv
    sent = asyncio.run(
        publish_paced(url, queue, rate=float(rate), seconds=float(seconds), seed=int(seed))
    )
    print(sent)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
