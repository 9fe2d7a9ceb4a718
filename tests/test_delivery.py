"""The delivery loop in one process: duplicates, reuse, bad input, retries, batches."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import replace

import aio_pika
import pytest

from consumers import App, Batch, Context, Publisher, Reject, Retry, Settings, Worker
from consumers.envelope import ATTEMPT_HEADER, REASON_HEADER
from consumers.retry import RetryPolicy
from dedupe import DbConnection
from tests.rawamqp import publish_raw
from tests.support import drain_dead_letters, settle, wait_for


def effects_app(queue: str, retry: RetryPolicy) -> App:
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

    return app


async def effect_count(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM effects")
    return count


async def test_same_message_published_twice_applies_effect_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    async with Worker(effects_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="order-1-shipped")
        await publisher.publish(queue_name, {"n": 1}, message_id="order-1-shipped")
        await wait_for(lambda: _processed(db, 1))
        await settle(lambda: effect_count(db), quiet=0.5)
    assert await effect_count(db) == 1


async def test_duplicate_arriving_after_commit_is_acked_without_effect(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    async with Worker(effects_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"b": 1, "a": [1, 2]}, message_id="m")
        await wait_for(lambda: _processed(db, 1))
        # Equivalent JSON, formatted otherwise: the same fingerprint.
        await publisher.publish(queue_name, b'{ "a": [1, 2], "b": 1 }', message_id="m")
        await wait_for(lambda: _queue_empty(channel, queue_name))
        await asyncio.sleep(0.3)
    assert await effect_count(db) == 1
    assert await drain_dead_letters(channel, queue_name) == []


async def test_same_message_id_in_two_tenants_applies_both(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    async with Worker(effects_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="welcome-1", tenant="acme")
        await publisher.publish(queue_name, {"n": 2}, message_id="welcome-1", tenant="globex")
        await wait_for(lambda: _processed(db, 2))
    rows = await db.fetch("SELECT tenant FROM effects ORDER BY tenant")
    assert [r["tenant"] for r in rows] == ["acme", "globex"]


async def test_reused_message_id_with_another_body_is_dead_lettered_without_effect(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    async with Worker(effects_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="welcome-1")
        await wait_for(lambda: _processed(db, 1))
        await publisher.publish(queue_name, {"n": 2}, message_id="welcome-1")
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
    dead = await drain_dead_letters(channel, queue_name)
    assert [d.message_id for d in dead] == ["welcome-1"]
    assert dead[0].headers[REASON_HEADER] == "message_id_reused"
    assert await db.fetchval("SELECT body FROM effects") == "1"
    assert await effect_count(db) == 1


async def test_reuse_within_one_batch_is_dead_lettered_without_effect(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # Published before the worker starts, so both land in its first batch.
    app = effects_app(queue_name, retry_policy)
    async with Worker(app, settings):
        pass  # declares the queues
    await publisher.publish(queue_name, {"n": 1}, message_id="k")
    await publisher.publish(queue_name, {"n": 2}, message_id="k")
    await publisher.publish(queue_name, {"n": 1}, message_id="k")
    async with Worker(app, settings):
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
        await wait_for(lambda: _queue_empty(channel, queue_name))
    assert await effect_count(db) == 1
    assert await db.fetchval("SELECT body FROM effects") == "1"


BAD_INPUTS = [
    ("invalid_json", aio_pika.Message(b"{not json", message_id="bad-1")),
    ("body_not_json_object", aio_pika.Message(b"[1, 2]", message_id="bad-2")),
    ("message_id_too_long", aio_pika.Message(b'{"n": 1}', message_id="x" * 129)),
    ("body_too_large", aio_pika.Message(b'{"n": "' + b"x" * 5000 + b'"}', message_id="bad-5")),
    (
        "unsupported_content_type",
        aio_pika.Message(b"<n/>", message_id="bad-6", content_type="text/xml"),
    ),
    ("invalid_json", aio_pika.Message(b'{"n": NaN}', message_id="bad-7")),
    ("invalid_json", aio_pika.Message(b'{"n": "\xff"}', message_id="bad-8")),
]


@pytest.mark.parametrize(
    ("reason", "message"), BAD_INPUTS, ids=[f"{r}-{i}" for i, (r, _) in enumerate(BAD_INPUTS)]
)
async def test_bad_input_is_dead_lettered_with_reason_and_the_worker_keeps_consuming(
    reason: str,
    message: aio_pika.Message,
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    small = replace(settings, worker=replace(settings.worker, max_body_bytes=4096))
    async with Worker(effects_app(queue_name, retry_policy), small):
        await publisher.publish_message(queue_name, message)
        await publisher.publish(queue_name, {"n": 2}, message_id="good-after-bad")
        await wait_for(lambda: _processed(db, 1))
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
    dead = await drain_dead_letters(channel, queue_name)
    assert len(dead) == 1
    assert dead[0].headers[REASON_HEADER] == reason
    assert dead[0].body == message.body
    assert await db.fetchval("SELECT message_id FROM effects") == "good-after-bad"


async def test_message_without_message_id_is_dead_lettered(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    async with Worker(effects_app(queue_name, retry_policy), settings):
        await publish_raw(queue_name, b'{"n": 1}')
        await publisher.publish(queue_name, {"n": 2}, message_id="good-after-bad")
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
        await wait_for(lambda: _processed(db, 1))
    dead = await drain_dead_letters(channel, queue_name)
    assert dead[0].headers["x-no-message-id"] is True
    assert dead[0].headers[REASON_HEADER] == "missing_message_id"
    assert await effect_count(db) == 1


async def test_handler_that_always_raises_is_dead_lettered_after_max_attempts_with_backoff(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    policy = RetryPolicy(max_attempts=3, base_seconds=0.3, tiers_seconds=(0.3, 0.6, 1.2))
    seen: list[tuple[int, float]] = []
    app = App(retry=policy)

    @app.handler(queue_name)
    async def always_fails(ctx: Context) -> None:
        seen.append((ctx.attempt, time.monotonic()))
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, 'rolled back', 0)",
            ctx.message_id,
        )
        raise RuntimeError("the downstream is broken")

    async with Worker(app, settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="doomed")
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1), timeout=20)
        await asyncio.sleep(0.5)
    attempts = [a for a, _ in seen]
    assert attempts == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(seen)]
    assert all(gap >= 0.3 for gap in gaps), gaps  # a delay tier sat between attempts
    dead = await drain_dead_letters(channel, queue_name)
    assert dead[0].headers[REASON_HEADER] == "max_attempts_exceeded:handler_error"
    assert dead[0].headers[ATTEMPT_HEADER] == 3
    assert "the downstream is broken" in str(dead[0].headers["x-error"])
    assert await effect_count(db) == 0
    assert await db.fetchval("SELECT count(*) FROM processed_messages") == 0


async def test_one_failing_handler_in_a_batch_leaves_the_others_committed_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    calls: dict[str, int] = {}
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def flaky(ctx: Context) -> None:
        calls[ctx.message_id] = calls.get(ctx.message_id, 0) + 1
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, $2, 0)",
            ctx.message_id,
            str(ctx.attempt),
        )
        if ctx.message_id == "m-3" and ctx.attempt == 1:
            raise Retry(delay=0.2, reason="not_yet")

    async with Worker(app, settings):
        pass  # declare
    for n in range(6):
        await publisher.publish(queue_name, {"n": n}, message_id=f"m-{n}")
    async with Worker(app, settings):  # all six arrive in one batch
        await wait_for(lambda: _processed(db, 6), timeout=15)
        await settle(lambda: effect_count(db), quiet=0.5)
    rows = await db.fetch("SELECT message_id, body FROM effects ORDER BY message_id")
    assert [(r["message_id"], r["body"]) for r in rows] == [
        ("m-0", "1"),
        ("m-1", "1"),
        ("m-2", "1"),
        ("m-3", "2"),
        ("m-4", "1"),
        ("m-5", "1"),
    ]
    assert calls["m-3"] == 3  # fast path, careful re-run, then the retry
    assert await drain_dead_letters(channel, queue_name) == []


async def test_reject_dead_letters_at_once_with_the_handlers_reason(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def picky(ctx: Context) -> None:
        if ctx.body.get("sku") is None:
            raise Reject(reason="missing_sku")

    async with Worker(app, settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="no-sku")
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
    dead = await drain_dead_letters(channel, queue_name)
    assert dead[0].headers[REASON_HEADER] == "missing_sku"
    assert dead[0].headers[ATTEMPT_HEADER] == 1


async def test_error_outside_retry_on_is_dead_lettered_without_retry(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    policy = RetryPolicy(max_attempts=5, tiers_seconds=(0.2,), retry_on=(TimeoutError,))
    app = App(retry=policy)
    seen: list[int] = []

    @app.handler(queue_name)
    async def buggy(ctx: Context) -> None:
        seen.append(ctx.attempt)
        raise KeyError("bug")

    async with Worker(app, settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="bug")
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
    assert seen == [1]  # one run, no retry
    dead = await drain_dead_letters(channel, queue_name)
    assert dead[0].headers[REASON_HEADER] == "handler_error"


async def test_failing_batch_handler_is_split_and_the_others_commit_once(
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
        await batch.tx.executemany(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, $2, 0)",
            [(m.message_id, str(m.body["n"])) for m in batch.messages],
        )
        if any(m.body["n"] == 5 for m in batch.messages):
            raise Reject(reason="five_is_poison")

    async with Worker(app, settings):
        pass
    for n in range(10):
        await publisher.publish(queue_name, {"n": n}, message_id=f"b-{n}")
    async with Worker(app, settings):
        await wait_for(lambda: _processed(db, 9), timeout=15)
        await wait_for(lambda: _dead_letter_count(channel, queue_name, 1))
    bodies = sorted(int(r["body"]) for r in await db.fetch("SELECT body FROM effects"))
    assert bodies == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    dead = await drain_dead_letters(channel, queue_name)
    assert [d.message_id for d in dead] == ["b-5"]


async def test_staged_effects_commit_once_with_one_statement_per_batch(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def staged(ctx: Context) -> None:
        await ctx.stage(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, $2, 0)",
            ctx.message_id,
            str(ctx.body["n"]),
        )
        if ctx.body["n"] == 3 and ctx.attempt == 1:
            raise Retry(delay=0.2)

    async with Worker(app, settings):
        for n in range(20):
            await publisher.publish(queue_name, {"n": n}, message_id=f"s-{n}")
            await publisher.publish(queue_name, {"n": n}, message_id=f"s-{n}")
        await wait_for(lambda: _processed(db, 20), timeout=15)
        await settle(lambda: effect_count(db), quiet=0.5)
    rows = await db.fetch("SELECT message_id, count(*) AS c FROM effects GROUP BY message_id")
    assert len(rows) == 20
    assert all(r["c"] == 1 for r in rows)


async def _processed(db: DbConnection, n: int) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM processed_messages") >= n)


async def _queue_empty(channel: aio_pika.abc.AbstractChannel, queue: str) -> bool:
    declared = await channel.declare_queue(queue, passive=True)
    return declared.declaration_result.message_count == 0


async def _dead_letter_count(channel: aio_pika.abc.AbstractChannel, queue: str, n: int) -> bool:
    declared = await channel.declare_queue(f"{queue}.dlq", passive=True)
    return (declared.declaration_result.message_count or 0) >= n
