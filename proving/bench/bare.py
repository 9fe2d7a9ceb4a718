"""Bare aio-pika consumers: the broker path's limit, and the naive exactly-once.

- `ceiling`: consume and ack, nothing else; prefetch and one `ack(multiple=True)`
  for whatever arrived since the last ack went out. The fastest the broker
  path goes in one Python process: the bar the framework is measured against.
- `ceiling_each`: the same, acking every message on its own.
- `naive`: what one writes by hand for exactly-once: per message, one asyncpg
  transaction (claim the key, insert the effect), commit, ack. Pool of 10.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import aio_pika
import asyncpg

from consumers import TENANT_HEADER
from dedupe import fingerprint
from proving.bench.sandbox import CLAIM_ONE, INSERT_EFFECT
from proving.bench.variant import POOL_SIZE, Run, Variant
from proving.deadlines import ANSWER_S, within

Delivery = aio_pika.abc.AbstractIncomingMessage


async def _queue(
    connection: aio_pika.abc.AbstractConnection, run: Run
) -> aio_pika.abc.AbstractQueue:
    channel = await within(ANSWER_S, "a channel", connection.channel())
    await channel.set_qos(prefetch_count=run.prefetch)
    return await channel.get_queue(run.sandbox.queue, ensure=False)


async def consume_acking_multiple(
    queue: aio_pika.abc.AbstractQueue, until: Callable[[], Awaitable[object]]
) -> None:
    """Consume `queue`, one `ack(multiple=True)` per wake-up and nothing else, until `until()`."""
    newest: list[Delivery] = []
    wake = asyncio.Event()

    async def on_message(message: Delivery) -> None:
        newest.append(message)
        wake.set()

    async def acker() -> None:
        while True:
            await wake.wait()  # unbounded: set by each delivery; cancelled at the end
            wake.clear()
            last = newest[-1]
            newest.clear()
            await last.ack(multiple=True)  # unbounded: the measured path; the round has its timeout

    task = asyncio.create_task(acker())
    tag = await queue.consume(on_message, timeout=ANSWER_S)
    await until()
    await queue.cancel(tag)
    task.cancel()


async def ceiling(run: Run) -> None:
    connection = await aio_pika.connect(run.settings.amqp.url, timeout=ANSWER_S)
    try:
        await consume_acking_multiple(await _queue(connection, run), run.finished)
    finally:
        await connection.close()


async def ceiling_each(run: Run) -> None:
    connection = await aio_pika.connect(run.settings.amqp.url, timeout=ANSWER_S)
    try:
        queue = await _queue(connection, run)

        async def on_message(message: Delivery) -> None:
            await message.ack()  # unbounded: the measured path; the round has its timeout

        tag = await queue.consume(on_message, timeout=ANSWER_S)
        await run.finished()
        await queue.cancel(tag)
    finally:
        await connection.close()


async def naive(run: Run) -> None:
    consumer = run.sandbox.queue
    pool = await asyncpg.create_pool(
        run.settings.database.url,
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
        server_settings=run.sandbox.search_path,
        timeout=ANSWER_S,
    )
    assert pool is not None
    connection = await aio_pika.connect(run.settings.amqp.url, timeout=ANSWER_S)
    try:
        queue = await _queue(connection, run)

        async def on_message(message: Delivery) -> None:
            body = json.loads(message.body)
            tenant = str((message.headers or {}).get(TENANT_HEADER, ""))
            async with pool.acquire() as conn, conn.transaction():
                claimed = await conn.fetchval(
                    CLAIM_ONE,
                    consumer,
                    tenant,
                    message.message_id,
                    fingerprint(body),
                    timeout=ANSWER_S,
                )
                if claimed:
                    await conn.execute(
                        INSERT_EFFECT,
                        consumer,
                        tenant,
                        message.message_id,
                        body["order_id"],
                        body["total_cents"],
                        timeout=ANSWER_S,
                    )
            await message.ack()  # unbounded: the measured path; the round has its timeout

        tag = await queue.consume(on_message, timeout=ANSWER_S)
        await run.finished()
        await queue.cancel(tag)
    finally:
        await connection.close()
        await pool.close()


VARIANTS = (
    Variant(
        name="ceiling",
        what="bare aio-pika consume, ack(multiple=True) per wake-up, no database",
        consume=ceiling,
        writes=False,
    ),
    Variant(
        name="ceiling_each",
        what="bare aio-pika consume, ack each message, no database",
        consume=ceiling_each,
        writes=False,
    ),
    Variant(
        name="naive",
        what="bare aio-pika, one transaction per message (claim + effect), pool of 10",
        consume=naive,
        slow=True,
    ),
)
