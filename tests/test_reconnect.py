"""The broker drops the worker's connection mid-batch: the ack fails, nothing crashes."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import MutableMapping, Sequence
from typing import Any

import pytest
import structlog

from consumers import App, Context, Publisher, RetryPolicy, Settings, Worker
from dedupe import DbConnection
from tests.conftest import AMQP_URL
from tests.support import close_broker_connections, no_message_ready, settle, wait_for

pytestmark = pytest.mark.skipif(
    shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to close a connection"
)


async def test_ack_on_a_channel_lost_after_commit_is_left_to_redelivery(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    release = asyncio.Event()
    runs: list[int] = []
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def slow(ctx: Context) -> None:
        runs.append(ctx.attempt)
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, '', 0)",
            ctx.message_id,
        )
        if len(runs) == 1:
            await release.wait()  # committed only after the connection is gone

    with structlog.testing.capture_logs() as logs:
        effects = await _drop_connection_mid_batch(
            app, settings, publisher, queue_name, db, runs, release, logs
        )
    events = [entry["event"] for entry in logs]
    assert "ack_failed" in events  # the path under test was taken...
    assert "batch_failed" not in events  # ...and handled where it belongs
    assert events.count("effect_committed") == 1
    assert events.count("duplicate_ignored") == 1  # the redelivery
    assert effects == 1
    assert runs == [1]


async def _drop_connection_mid_batch(
    app: App,
    settings: Settings,
    publisher: Publisher,
    queue_name: str,
    db: DbConnection,
    runs: list[int],
    release: asyncio.Event,
    logs: list[MutableMapping[str, Any]],
) -> int:
    async with Worker(app, settings) as worker:
        await publisher.publish(queue_name, {"n": 1}, message_id="survives-a-reconnect")
        await wait_for(lambda: _ran(runs))
        name = f"idempotent-workers {worker.worker_id}"
        closed = await asyncio.to_thread(close_broker_connections, name)
        assert closed == 1
        release.set()  # commit now; its ack goes to a dead channel

        async def processed() -> bool:
            return bool(await db.fetchval("SELECT count(*) FROM processed_messages") == 1)

        await wait_for(processed, timeout=30)

        # After the robust reconnect (aio-pika waits its reconnect interval,
        # 5 s by default) the broker redelivers; the claim makes it a duplicate.
        async def redelivered() -> bool:
            return any(entry["event"] == "duplicate_ignored" for entry in logs)

        await wait_for(redelivered, timeout=60)
        effects = await settle(lambda: _effects(db), quiet=1.0)
    assert isinstance(effects, int)
    return effects


async def _ran(runs: Sequence[object], n: int = 1) -> bool:
    return len(runs) >= n


async def _effects(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM effects")
    return count


async def test_deliveries_of_a_channel_closed_since_are_not_run(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    """Buffered deliveries of a lost channel are the broker's again: they run once, redelivered.

    Run anyway they cost a handler call each (a slow one, a retry published
    twice) and an ack that cannot go out, and behind them the redelivered
    copies wait: a worker reconnecting often fell further behind each time.
    """
    release = asyncio.Event()
    runs: list[str] = []
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        runs.append(ctx.message_id)
        if ctx.message_id == "blocker":
            await release.wait()  # the others queue up behind it, then the channel goes

    with structlog.testing.capture_logs() as logs:
        async with Worker(app, settings) as worker:
            await publisher.publish(queue_name, {"n": 0}, message_id="blocker")
            await wait_for(lambda: _ran(runs))
            for n in range(20):
                await publisher.publish(queue_name, {"n": n}, message_id=f"behind-{n}")
            await wait_for(lambda: no_message_ready(AMQP_URL, queue_name))
            closed = await asyncio.to_thread(
                close_broker_connections, f"idempotent-workers {worker.worker_id}"
            )
            assert closed == 1
            release.set()

            async def all_ran() -> bool:
                return len(set(runs)) == 21

            await wait_for(all_ran, timeout=60)
            await settle(lambda: _effects_of(db), quiet=1.0)
    events = [entry["event"] for entry in logs]
    assert sorted(runs) == sorted(["blocker", *(f"behind-{n}" for n in range(20))])
    assert events.count("ack_failed") == 1  # the blocker's, in flight when the channel went
    assert events.count("stale_deliveries_dropped") >= 1


async def _effects_of(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM processed_messages")
    return count
