"""The database fails under a batch: a killed session, a real deadlock."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import asyncpg
import structlog

from consumers import App, Context, Publisher, RetryPolicy, Settings, Worker
from dedupe import DbConnection
from tests.conftest import DATABASE_URL
from tests.support import settle, wait_for


async def test_session_killed_mid_batch_is_rerun_and_applies_effects_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    inside = asyncio.Event()
    release = asyncio.Event()
    runs: list[str] = []
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        runs.append(ctx.message_id)
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, '', 0)",
            ctx.message_id,
        )
        if len(runs) == 1:
            inside.set()
            await release.wait()
            await ctx.tx.execute("SELECT 1")  # the session is gone by now

    with structlog.testing.capture_logs() as logs:
        async with Worker(app, settings) as worker:
            await publisher.publish(queue_name, {"n": 1}, message_id="survives-a-dead-session")
            await asyncio.wait_for(inside.wait(), timeout=30)
            admin = await asyncpg.connect(DATABASE_URL)
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1 AND state <> 'idle'",
                f"idempotent-workers {worker.worker_id}",
            )
            await admin.close()
            assert killed == 1
            release.set()

            async def done() -> bool:
                return bool(await db.fetchval("SELECT count(*) FROM processed_messages") == 1)

            await wait_for(done, timeout=30)
            effects = await settle(lambda: _effects(db), quiet=1.0)
    events = [entry["event"] for entry in logs]
    assert "batch_rerun" in events, [e.get("error") for e in logs]
    assert effects == 1
    assert runs == ["survives-a-dead-session"] * 2  # rolled back with the session, run again
    assert events.count("effect_committed") == 1


async def test_deadlock_between_two_batches_is_retried_and_both_apply_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
) -> None:
    await db.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL)")
    await db.execute("INSERT INTO accounts VALUES (1, 0), (2, 0)")
    both_hold_one = asyncio.Barrier(2)
    policy = RetryPolicy(max_attempts=3, tiers_seconds=(0.2, 0.5))
    app = App(retry=policy)

    @app.handler(queue_name)
    async def transfer(ctx: Context) -> None:
        first, second = ctx.body["from"], ctx.body["to"]
        await ctx.tx.execute("UPDATE accounts SET balance = balance - 1 WHERE id = $1", first)
        if ctx.attempt == 1:
            await asyncio.wait_for(both_hold_one.wait(), timeout=10)
        await ctx.tx.execute("UPDATE accounts SET balance = balance + 1 WHERE id = $1", second)
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, '', 0)",
            ctx.message_id,
        )

    # Two channels, one message per batch: the two transfers run in two
    # transactions at once and lock the rows in opposite orders.
    two_at_once = replace(
        settings, worker=replace(settings.worker, concurrency=2, max_batch=1, prefetch=1)
    )
    with structlog.testing.capture_logs() as logs:
        async with Worker(app, two_at_once):
            await publisher.publish(queue_name, {"from": 1, "to": 2}, message_id="t-1")
            await publisher.publish(queue_name, {"from": 2, "to": 1}, message_id="t-2")

            async def done() -> bool:
                return bool(await db.fetchval("SELECT count(*) FROM processed_messages") == 2)

            await wait_for(done, timeout=30)
            effects = await settle(lambda: _effects(db), quiet=1.0)
    retries = [e for e in logs if e["event"] == "retry_scheduled"]
    assert [r["reason"] for r in retries] == ["transient_database_error"]
    assert "DeadlockDetectedError" in retries[0]["error"]
    assert effects == 2
    balances = await db.fetch("SELECT balance FROM accounts ORDER BY id")
    assert [r["balance"] for r in balances] == [0, 0]


async def _effects(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM effects")
    return count
