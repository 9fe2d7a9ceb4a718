"""FastStream's RabbitMQ subscriber with the naive per-message transaction.

Written as FastStream's documentation shows: a `RabbitBroker`, a
`@broker.subscriber(queue)` handler that takes the decoded body and the
message, FastStream's default ack policy (ack once the handler returned) and
its default access log (a line when a message is received and one when it is
processed, here to the bench's log file). The handler's work is the naive
consumer's: one asyncpg transaction per message, claim then effect, pool of 10.

`faststream_prefetch` is the fastest form found: the same handler with a
channel prefetch (the documented `Channel(prefetch_count=...)`), where the
default consumes with no prefetch limit at all.

FastStream is a benchmark-only dependency (`pip install 'idempotent-workers[bench]'`).
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
from faststream.rabbit import Channel, RabbitBroker, RabbitMessage, RabbitQueue

from consumers import TENANT_HEADER
from dedupe import fingerprint
from proving.bench.sandbox import CLAIM_ONE, INSERT_EFFECT
from proving.bench.variant import POOL_SIZE, Run, Variant
from proving.deadlines import ANSWER_S


def _access_log(path: str) -> logging.Logger:
    logger = logging.getLogger("bench.faststream")
    logger.propagate = False
    if not logger.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger


async def _consume(run: Run, *, channel: Channel | None) -> None:
    consumer = run.sandbox.queue
    pool = await asyncpg.create_pool(
        run.settings.database.url,
        min_size=POOL_SIZE,
        max_size=POOL_SIZE,
        server_settings=run.sandbox.search_path,
        timeout=ANSWER_S,
    )
    assert pool is not None
    broker = RabbitBroker(
        run.settings.amqp.url, logger=_access_log(run.log_file), default_channel=channel
    )

    @broker.subscriber(RabbitQueue(consumer, declare=False))
    async def handle(body: dict[str, Any], message: RabbitMessage) -> None:
        tenant = str(message.headers.get(TENANT_HEADER, ""))
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

    try:
        await broker.start()
        await run.finished()
    finally:
        await broker.stop()
        await pool.close()


async def faststream_docs(run: Run) -> None:
    await _consume(run, channel=None)


async def faststream_prefetch(run: Run) -> None:
    await _consume(run, channel=Channel(prefetch_count=run.prefetch))


VARIANTS = (
    Variant(
        name="faststream",
        what="FastStream subscriber as documented, one transaction per message, pool of 10",
        consume=faststream_docs,
        slow=True,
    ),
    Variant(
        name="faststream_prefetch",
        what="the same with Channel(prefetch_count=1000) (FastStream's default has no limit)",
        consume=faststream_prefetch,
        slow=True,
    ),
)
