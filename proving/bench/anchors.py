"""Anchors at our own layer: aiormq read by hand, with and without the durable work.

The framework reads aiormq's frames itself (`consumers.broker.consume`), so
`bare` (aio-pika, a task and an `IncomingMessage` per delivery) prices
aio-pika as much as exactly-once. These two are what one writes by hand at
our layer:

- `aiormq`: aiormq's own consumer (`basic_consume` with a callback), prefetch,
  one `basic_ack(multiple=True)` per wake-up for what arrived since the last,
  a log line per message; no database.
- `handwritten`: the same consumer and a group-commit loop on one asyncpg
  connection doing the framework's durable work: while a batch commits, the
  deliveries gather; the next batch (up to BATCH) is one transaction: the
  claim of its keys, sorted, in one statement (`claim_messages()`, the
  statement the framework's `Inbox.claim` sends), the effects of the keys it
  newly claimed in one INSERT, COMMIT; then one ack `multiple=True` for the
  batch and a log line per message, as the framework does. No decode
  checks, no retries, no dead letters, no reuse check: nothing the bench's
  clean messages do not need.

Both log at info, as JSON to the bench's log file, through structlog as the
CLI configured it. The stopwatch times them as it times every variant: it
wraps aiormq's `basic_consume` callback and `basic_ack` while they run
(`Stopwatch.aiormq_installed`).
"""

from __future__ import annotations

import asyncio
import json

import aiormq
import asyncpg
import structlog
from aiormq.abc import DeliveredMessage

from consumers import TENANT_HEADER
from dedupe import fingerprint, quote_ident
from proving.bench.sandbox import INSERT_EFFECTS
from proving.bench.variant import Run, Variant
from proving.deadlines import ANSWER_S, within

BATCH = 500  # the framework's default batch size
log = structlog.get_logger("proving.bench.anchors")


async def _channel(run: Run) -> tuple[aiormq.abc.AbstractConnection, aiormq.abc.AbstractChannel]:
    connection = await within(
        ANSWER_S, "an aiormq connection", aiormq.connect(run.settings.amqp.url)
    )
    channel = await within(ANSWER_S, "an aiormq channel", connection.channel())
    await channel.basic_qos(prefetch_count=run.prefetch, timeout=ANSWER_S)
    return connection, channel


async def raw_aiormq(run: Run) -> None:
    with run.watch.aiormq_installed():
        connection, channel = await _channel(run)
        newest: list[DeliveredMessage] = []
        wake = asyncio.Event()

        async def on_message(message: DeliveredMessage) -> None:
            newest.append(message)
            wake.set()

        async def acker() -> None:
            while True:
                await wake.wait()  # unbounded: set by each delivery; cancelled at the end
                wake.clear()
                batch = newest[:]
                newest.clear()
                # unbounded: the measured path; the round has its timeout
                await channel.basic_ack(batch[-1].delivery_tag or 0, multiple=True)
                for message in batch:
                    log.info("message_acked", message_id=message.header.properties.message_id)

        task = asyncio.create_task(acker())
        try:
            await channel.basic_consume(run.sandbox.queue, on_message, timeout=ANSWER_S)
            await run.finished()
        finally:
            task.cancel()
            await connection.close()


async def handwritten(run: Run) -> None:
    consumer = run.sandbox.queue
    claim = (
        f"SELECT * FROM {quote_ident(run.sandbox.schema)}.claim_messages("
        "$1::text[], $2::text[], $3::text[], $4::bytea[])"
    )
    db = await asyncpg.connect(
        run.settings.database.url,
        # The framework's backstop too (consumers.runtime.worker.create_pool): the server
        # ends a statement that outlives it, so the claim and effects need no client timer.
        server_settings={**run.sandbox.search_path, "statement_timeout": str(int(ANSWER_S * 1000))},
        timeout=ANSWER_S,
    )
    with run.watch.aiormq_installed():
        connection, channel = await _channel(run)
        waiting: list[DeliveredMessage] = []
        wake = asyncio.Event()

        async def on_message(message: DeliveredMessage) -> None:
            waiting.append(message)
            wake.set()

        async def commit(batch: list[DeliveredMessage]) -> None:
            jobs = sorted(
                (
                    str((m.header.properties.headers or {}).get(TENANT_HEADER, "")),
                    m.header.properties.message_id or "",
                    json.loads(m.body),
                )
                for m in batch
            )
            async with db.transaction():
                claimed = {
                    (r[1], r[2])
                    # unbounded: the session's statement_timeout, as the framework's claim
                    for r in await db.fetch(
                        claim,
                        [consumer] * len(jobs),
                        [tenant for tenant, _, _ in jobs],
                        [message_id for _, message_id, _ in jobs],
                        [fingerprint(body) for _, _, body in jobs],
                    )
                }
                new = [job for job in jobs if (job[0], job[1]) in claimed]
                if new:
                    # unbounded: the session's statement_timeout, as the framework's effects
                    await db.execute(
                        INSERT_EFFECTS,
                        [consumer] * len(new),
                        [tenant for tenant, _, _ in new],
                        [message_id for _, message_id, _ in new],
                        [body["order_id"] for _, _, body in new],
                        [body["total_cents"] for _, _, body in new],
                    )
            # <- durable: only now the ack
            await channel.basic_ack(batch[-1].delivery_tag or 0, multiple=True)
            for tenant, message_id, _ in jobs:
                outcome = "effect_committed" if (tenant, message_id) in claimed else "duplicate"
                log.info(outcome, consumer=consumer, tenant=tenant, message_id=message_id)

        async def loop() -> None:
            while True:
                await wake.wait()  # unbounded: set by each delivery; cancelled at the end
                wake.clear()
                while waiting:
                    batch = waiting[:BATCH]
                    del waiting[:BATCH]
                    await commit(batch)  # unbounded: the measured path; the round has its timeout

        task = asyncio.create_task(loop())
        try:
            await channel.basic_consume(run.sandbox.queue, on_message, timeout=ANSWER_S)
            await run.finished()
        finally:
            task.cancel()
            await connection.close()
            await db.close()


VARIANTS = (
    Variant(
        name="aiormq",
        what="aiormq's own consumer, ack(multiple=True) per wake-up, a log line each, no database",
        consume=raw_aiormq,
        writes=False,
    ),
    Variant(
        name="handwritten",
        what="aiormq + asyncpg by hand: group commit (claim, effects, COMMIT), then ack multiple",
        consume=handwritten,
    ),
)
