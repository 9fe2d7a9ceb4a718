"""A handler's failure is that message's alone: it raises, times out, hangs or blocks.

Each test puts one kind of bad handler beside good messages and checks what
the good ones get: their effects, once, and no dead letter.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import aio_pika
import pytest

from consumers import App, Context, Publisher
from dedupe import DbConnection
from tests.conftest import AMQP_URL, Spawn
from tests.harness import Harness
from tests.support import drain_dead_letters, wait_declared, wait_for

INSERT = (
    "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
    " VALUES ($1, '', $2, '', 0)"
)


async def _good_effects(db: DbConnection) -> dict[str, int]:
    rows = await db.fetch(
        "SELECT message_id, count(*) AS n FROM effects WHERE message_id LIKE 'good-%'"
        " GROUP BY message_id"
    )
    return {r["message_id"]: r["n"] for r in rows}


@pytest.mark.parametrize(
    "error",
    [TimeoutError("upstream timed out"), ConnectionRefusedError(111, "Connection refused")],
    ids=["TimeoutError", "ConnectionRefusedError"],
)
async def test_handler_raising_timeout_or_os_errors_harms_only_its_own_messages(
    harness: Harness, error: Exception
) -> None:
    """Case 1 of issue 8: an OSError from handler code is the handler's, not the database's."""
    app = App(retry=harness.retry)

    @app.handler(harness.queue)
    async def call_out(ctx: Context) -> None:
        await ctx.tx.execute(INSERT, ctx.consumer, ctx.message_id)
        if ctx.body.get("bad"):
            raise error

    async with harness.run(app):
        pass  # declare
    for n in range(30):
        await harness.publish({"bad": True}, message_id=f"bad-{n}")
        await harness.publish({}, message_id=f"good-{n}")
    began = time.monotonic()
    async with harness.run(app):  # the sixty arrive together
        await harness.wait_dead_letters(30, timeout=90)
        await wait_for(lambda: _has_effects(harness.db, 30), timeout=30)
    elapsed = time.monotonic() - began
    good = await _good_effects(harness.db)
    assert good == {f"good-{n}": 1 for n in range(30)}, f"good effects: {len(good)}"
    dead = await harness.dead_letters()
    assert sorted(str(m.message_id) for m in dead) == sorted(f"bad-{n}" for n in range(30))
    assert {m.headers["x-reason"] for m in dead} == {"max_attempts_exceeded:handler_error"}
    assert type(error).__name__ in str(dead[0].headers["x-error"])
    assert harness.outcomes()["batch_rerun"] == 0  # never taken for a lost database
    print(f"case 1 ({type(error).__name__}): 30 good effected, settled in {elapsed:.1f} s")


async def _has_effects(db: DbConnection, n: int) -> bool:
    return len(await _good_effects(db)) >= n


@pytest.mark.parametrize("hang", ["event", "pg_sleep"])
async def test_handler_that_never_returns_is_retried_and_the_others_commit(
    harness: Harness, hang: str
) -> None:
    """Case 2 of issue 8: past its deadline a handler is cancelled, its message retried."""
    app = App(retry=harness.retry)

    @app.handler(harness.queue, timeout=1.0)
    async def sometimes_hangs(ctx: Context) -> None:
        await ctx.tx.execute(INSERT, ctx.consumer, ctx.message_id)
        if ctx.body.get("hang"):
            if hang == "event":
                await asyncio.Event().wait()  # never set
            else:
                await ctx.tx.execute("SELECT pg_sleep(3600)")

    async with harness.run(app):
        pass  # declare
    for n in range(10):
        await harness.publish({}, message_id=f"good-{n}")
        if n == 4:
            await harness.publish({"hang": True}, message_id="hangs")
    began = time.monotonic()
    async with harness.run(app):
        await wait_for(lambda: _has_effects(harness.db, 10), timeout=30)
        committed_after = time.monotonic() - began
        await harness.wait_dead_letters(1, timeout=60)
    assert await _good_effects(harness.db) == {f"good-{n}": 1 for n in range(10)}
    dead = await harness.dead_letters()
    assert [(m.message_id, m.headers["x-reason"]) for m in dead] == [
        ("hangs", "max_attempts_exceeded:handler_timeout")
    ]
    assert harness.outcomes()["retry_scheduled"] == 2  # attempts 1 and 2 of 3
    assert await harness.db.fetchval("SELECT count(*) FROM effects WHERE message_id = 'hangs'") == 0
    print(f"case 2 ({hang}): 10 good effected {committed_after:.1f} s after start")


async def test_duplicate_of_a_hanging_message_does_not_stop_a_second_worker(
    harness: Harness,
) -> None:
    """Case 2 of issue 8: the hanging handler's claim is released at its deadline."""
    app = App(retry=harness.retry)
    entered = asyncio.Event()

    @app.handler(harness.queue, timeout=3.0)
    async def sometimes_hangs(ctx: Context) -> None:
        await ctx.tx.execute(INSERT, ctx.consumer, ctx.message_id)
        if ctx.body.get("hang"):
            entered.set()
            await asyncio.Event().wait()  # never set

    one_at_a_time = replace(harness.settings, worker=replace(harness.settings.worker, prefetch=1))
    async with harness.run(app, one_at_a_time):
        await harness.publish({"hang": True}, message_id="hangs")
        await asyncio.wait_for(entered.wait(), timeout=30)
        async with harness.run(app):
            # The first worker holds "hangs" unacked (prefetch 1): all of these go to the second.
            await harness.publish({"hang": True}, message_id="hangs")
            for n in range(10):
                await harness.publish({}, message_id=f"good-{n}")
            began = time.monotonic()
            await wait_for(lambda: _has_effects(harness.db, 10), timeout=30)
            committed_after = time.monotonic() - began
            await harness.wait_dead_letters(2, timeout=90)
    assert await _good_effects(harness.db) == {f"good-{n}": 1 for n in range(10)}
    dead = await harness.dead_letters()
    assert [m.message_id for m in dead] == ["hangs", "hangs"]
    print(f"case 2 (duplicate on a second worker): 10 good effected in {committed_after:.1f} s")


async def test_handler_blocking_the_event_loop_gets_its_process_restarted(
    db: DbConnection,
    queue_name: str,
    spawn: Spawn,
    channel: aio_pika.abc.AbstractChannel,
    publisher: Publisher,
    tmp_path: Path,
) -> None:
    """Case 2 of issue 8: a handler that ignores cancellation (time.sleep) ends its process.

    The watchdog notices the loop has not run for deadline + grace and exits
    non-zero; the broker redelivers, and a second worker applies every message once.
    """
    marker = tmp_path / "blocking"
    deadline, grace = 1.0, 2.0
    first = spawn(
        {
            "IW_HANDLER_TIMEOUT": str(deadline),
            "IW_WATCHDOG_GRACE": str(grace),
            "TEST_BLOCK_MARKER": str(marker),
        }
    )
    await wait_declared(AMQP_URL, queue_name)
    for n in range(10):
        await publisher.publish(queue_name, {"n": n}, message_id=f"good-{n}")
        if n == 4:
            await publisher.publish(queue_name, {"block_s": 600}, message_id="blocks")

    async def blocking() -> bool:
        return marker.exists()

    await wait_for(blocking, timeout=30)
    blocked_at = time.monotonic()
    code = await first.wait(timeout=60)
    exited_after = time.monotonic() - blocked_at
    assert code not in (0, None)
    assert exited_after < deadline + grace + 10  # the machine is shared: some slack
    assert first.events("watchdog_expired"), first.log_text()[-2000:]

    second = spawn({"TEST_BLOCK_MARKER": ""})
    await wait_for(lambda: _has_effects(db, 10), timeout=60)

    async def blocker_applied() -> bool:
        n: int = await db.fetchval("SELECT count(*) FROM effects WHERE message_id = 'blocks'")
        return n >= 1

    await wait_for(blocker_applied, timeout=60)
    assert await _good_effects(db) == {f"good-{n}": 1 for n in range(10)}
    assert await db.fetchval("SELECT count(*) FROM effects WHERE message_id = 'blocks'") == 1
    assert await drain_dead_letters(channel, queue_name) == []
    second.terminate()
    await second.expect_exit(0)
    print(f"case 2 (blocking): process exited {code} after {exited_after:.1f} s")


async def test_worker_sessions_end_a_transaction_the_deadline_did_not(harness: Harness) -> None:
    """The backstop: statement_timeout and idle_in_transaction_session_timeout.

    Derived from the longest handler deadline plus the watchdog's grace, so a
    transaction a stuck process holds is ended by the server.
    """
    app = App(retry=harness.retry)

    @app.handler(harness.queue, timeout=2.0)
    async def record(ctx: Context) -> None:
        await ctx.tx.execute(INSERT, ctx.consumer, ctx.message_id)

    worker_settings = replace(
        harness.settings.worker, handler_timeout_seconds=1.0, watchdog_grace_seconds=3.0
    )
    async with harness.run(app, replace(harness.settings, worker=worker_settings)) as worker:
        assert worker.stuck_after == 5.0
        assert worker.pool is not None
        async with worker.pool.acquire() as conn:
            assert await conn.fetchval("SHOW statement_timeout") == "5s"
            assert await conn.fetchval("SHOW idle_in_transaction_session_timeout") == "5s"
