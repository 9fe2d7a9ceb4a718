"""ctx.emit(): a follow-up exists if and only if its message's effects committed."""

from __future__ import annotations

import aio_pika

from consumers import App, Batch, Context, Publisher, Reject, Retry, RetryPolicy, Settings, Worker
from dedupe import DbConnection
from tests.support import settle, wait_for


def emitting_app(queue: str, retry: RetryPolicy) -> App:
    """Records an effect and emits a follow-up; `fail` in the body raises after emitting."""
    app = App(retry=retry)

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, $4, 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
            str(ctx.body.get("n", "")),
        )
        await ctx.emit("follow.up", {"of": ctx.message_id}, message_id=f"{ctx.message_id}:next")
        if ctx.body.get("fail") == "retry":
            raise Retry(delay=0.1)
        if ctx.body.get("fail") == "reject":
            raise Reject(reason="no_good")

    return app


async def _declare(app: App, settings: Settings) -> None:
    async with Worker(app, settings):
        pass  # declares the queues; what is published next lands in one batch


async def _outbox(db: DbConnection) -> list[tuple[str, str, str, str]]:
    rows = await db.fetch("SELECT queue, tenant, message_id, body FROM outbox ORDER BY message_id")
    return [(r["queue"], r["tenant"], r["message_id"], bytes(r["body"]).decode()) for r in rows]


async def _effects(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM effects")
    return count


async def test_each_committed_message_emits_its_follow_up_once_in_its_tenant(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    app = emitting_app(queue_name, retry_policy)
    await _declare(app, settings)
    for n in range(5):
        await publisher.publish(queue_name, {"n": n}, message_id=f"m{n}", tenant="acme")
    async with Worker(app, settings):
        await wait_for(lambda: _has(db, 5))
    assert await _outbox(db) == [
        ("follow.up", "acme", f"m{n}:next", f'{{"of":"m{n}"}}') for n in range(5)
    ]


async def test_a_duplicate_emits_nothing_again(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = emitting_app(queue_name, retry_policy)
    await _declare(app, settings)
    async with Worker(app, settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="m1")
        await wait_for(lambda: _has(db, 1))
        await publisher.publish(queue_name, {"n": 1}, message_id="m1")
        await publisher.publish(queue_name, {"n": 1}, message_id="m1")
        await settle(lambda: _queue_depth(channel, queue_name), quiet=0.5)
    assert [m for _, _, m, _ in await _outbox(db)] == ["m1:next"]


async def test_a_message_whose_handler_raised_emits_nothing_and_its_batch_mates_emit_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # The fast path runs every handler, then one raises: the whole batch is
    # rolled back and re-run with a savepoint per message. The raiser's emit
    # must go with its savepoint, the others' must be written once, not twice.
    app = emitting_app(queue_name, retry_policy)
    await _declare(app, settings)
    await publisher.publish(queue_name, {"n": 0}, message_id="m0")
    await publisher.publish(queue_name, {"n": 1, "fail": "reject"}, message_id="m1")
    await publisher.publish(queue_name, {"n": 2}, message_id="m2")
    await publisher.publish(queue_name, {"n": 3, "fail": "retry"}, message_id="m3")
    await publisher.publish(queue_name, {"n": 4}, message_id="m4")
    async with Worker(app, settings):
        # m3 is retried until its attempts run out, then dead-lettered too.
        await wait_for(lambda: _dead(channel, queue_name, 2), timeout=60)
    assert [m for _, _, m, _ in await _outbox(db)] == ["m0:next", "m2:next", "m4:next"]
    assert await _effects(db) == 3


async def test_a_batch_handler_emits_only_for_the_messages_that_commit(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = App(retry=retry_policy)

    @app.batch_handler(queue_name)
    async def record_all(batch: Batch) -> None:
        for ctx in batch.messages:
            await ctx.emit("follow.up", {}, message_id=f"{ctx.message_id}:next")
        if any(ctx.body.get("fail") for ctx in batch.messages):
            raise Reject(reason="no_good")

    await _declare(app, settings)
    for n in range(6):
        await publisher.publish(queue_name, {"n": n, "fail": n == 4}, message_id=f"m{n}")
    async with Worker(app, settings):
        await wait_for(lambda: _dead(channel, queue_name, 1))
        await wait_for(lambda: _has(db, 5))
    assert [m for _, _, m, _ in await _outbox(db)] == [f"m{n}:next" for n in (0, 1, 2, 3, 5)]


async def _has(db: DbConnection, rows: int) -> bool:
    return len(await _outbox(db)) >= rows


async def _queue_depth(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    q = await channel.declare_queue(queue, passive=True)
    return q.declaration_result.message_count or 0


async def _dead(channel: aio_pika.abc.AbstractChannel, queue: str, count: int) -> bool:
    declared = await channel.declare_queue(f"{queue}.dlq", passive=True)
    return (declared.declaration_result.message_count or 0) >= count
