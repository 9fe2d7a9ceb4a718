"""A publisher at a steady rate, in its own process: the load of the paced mode.

    python -m proving.bench.pacer AMQP_URL QUEUE RATE SECONDS SEED

Publishers are other services in production, on other machines; here this
one shares the cores with the consumer it loads, so what it spends a message
is taken from the variant being timed. So it spends next to nothing a
message, with the frames any client would send:

1. before the clock starts, every message (body and properties) is built and
   marshalled into the bytes of its three frames (Basic.Publish, the content
   header, the body) by aiormq's own `ChannelFrame.marshall`, whose frames
   pamqp encodes: what `Channel.basic_publish` would write for it, without
   confirms;
2. every TICK_SECONDS it puts what is due by then on the connection's write
   queue as one write, the bytes of those messages joined; no per-message
   objects, no task, no confirm;
3. at the end one round trip on the channel (the broker answers it only
   after reading every publish before it), then it prints how many messages
   it sent and the CPU seconds it spent publishing them.

Publishing each message with `basic_publish(wait=False)`, as this pacer did
before, took 29% of a core at 5,000 msg/s; this takes 4% (medians of five,
in the message of 1e32580).

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
from aiormq.abc import ChannelFrame
from pamqp import commands
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

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


def marshalled(channel: aiormq.Channel, queue: str, n: int, rng: random.Random) -> bytes:
    """Job `n`'s publish to `queue` on `channel`: the bytes `basic_publish` would write."""
    body, properties = _frames(n, rng)
    if len(body) >= channel.max_content_size:  # one body frame, as basic_publish would send
        raise ValueError(f"a paced job of {len(body)} bytes needs more than one body frame")
    return ChannelFrame.marshall(
        channel.number,
        [
            commands.Basic.Publish(exchange="", routing_key=queue),
            ContentHeader(body_size=len(body), properties=properties),
            ContentBody(body),
        ],
    ).payload


async def publish_paced(
    url: str, queue: str, *, rate: float, seconds: float, seed: int
) -> tuple[int, float]:
    """Publish `rate` msg/s to `queue` for `seconds`; return the count sent and the
    CPU seconds publishing took."""
    rng = random.Random(seed)
    connection = await within(ANSWER_S, "a connection", aiormq.connect(url))
    try:
        # aiormq's Channel: its number and body frame size (the abstract one does not say so).
        channel = cast(
            aiormq.Channel,
            await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=False)),
        )
        total = int(rate * seconds)
        publishes = [marshalled(channel, queue, n, rng) for n in range(total)]
        started = time.perf_counter()
        cpu = time.process_time()
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - started) * rate) + 1)
            if due > sent:
                await connection.write_queue.put(
                    ChannelFrame(payload=b"".join(publishes[sent:due]), should_close=False)
                )
                sent = due
            await asyncio.sleep(TICK_SECONDS)
        await within(ANSWER_S, "the broker's read of the publishes", channel.basic_qos())
        return sent, time.process_time() - cpu
    finally:
        await within(ANSWER_S, "the connection's close", connection.close())


def main(argv: list[str]) -> int:
    url, queue, rate, seconds, seed = argv
    sent, cpu_seconds = asyncio.run(
        publish_paced(url, queue, rate=float(rate), seconds=float(seconds), seed=int(seed))
    )
    print(sent, f"{cpu_seconds:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
