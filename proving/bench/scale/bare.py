"""The bare side of the scale runs: the bench's `ceiling` loop as a process of its own.

    BENCH_SCALE_DIR=/tmp/d python -m proving.bench.scale.bare AMQP_URL QUEUE PREFETCH

Consumes and acks (`ack(multiple=True)` per wake-up, nothing else) until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import aio_pika

from proving.bench.bare import consume_acking_multiple
from proving.bench.scale.instrument import install_from_env
from proving.deadlines import ANSWER_S, within


async def consume(url: str, queue_name: str, prefetch: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(queue_name, ensure=False)
        await consume_acking_multiple(queue, stop.wait)
    finally:
        await connection.close()


if __name__ == "__main__":
    install_from_env()
    asyncio.run(consume(sys.argv[1], sys.argv[2], int(sys.argv[3])))
