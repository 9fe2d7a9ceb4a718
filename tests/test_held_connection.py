"""A batch loop keeps its database connection between batches (consumers.pipeline.held),
and with a batch waiting, the next transaction begins with the last one's COMMIT."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import asyncpg
import pytest
from asyncpg.transaction import Transaction

from consumers import App, Context, Publisher, Reject, RetryPolicy, Settings, Worker
from consumers.broker.topology import declare
from consumers.pipeline import held as held_module
from consumers.pipeline.held import HeldConnection
from dedupe import DbConnection
from proving.deadlines import ANSWER_S
from tests.conftest import DATABASE_URL
from tests.support import settle, wait_for

INSERT = (
    "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
    " VALUES ('x', '', $1, $2, pg_backend_pid())"
)


def _recording_app(queue: str, retry_policy: RetryPolicy) -> App:
    """Each message's effect row carries the session's backend pid and a session setting."""
    app = App(retry=retry_policy)

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        seen = await ctx.tx.fetchval("SELECT current_setting('iw_test.marker', true)")
        await ctx.tx.execute(INSERT, ctx.message_id, seen or "")
        if ctx.message_id == "first":
            await ctx.tx.execute("SET iw_test.marker TO 'kept'")  # session-wide, not LOCAL

    return app


async def _row(db: DbConnection, message_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await db.fetchrow(
        "SELECT body, worker_pid FROM effects WHERE message_id = $1", message_id
    )
    return row


async def _committed(db: DbConnection, message_id: str) -> bool:
    return await _row(db, message_id) is not None


async def test_batches_of_one_loop_share_its_connection_with_no_reset_between_them(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    async with Worker(_recording_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="first")
        await wait_for(lambda: _committed(db, "first"))
        await publisher.publish(queue_name, {"n": 2}, message_id="second")
        await wait_for(lambda: _committed(db, "second"))
    first, second = await _row(db, "first"), await _row(db, "second")
    assert first is not None and second is not None
    assert second["worker_pid"] == first["worker_pid"]  # the same session
    assert second["body"] == "kept"  # not reset in between (a pool's release runs RESET ALL)


async def test_held_connection_lost_between_batches_the_next_commits_once_on_a_new_one(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    async with Worker(_recording_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="first")
        await wait_for(lambda: _committed(db, "first"))
        first = await _row(db, "first")
        assert first is not None
        admin = await asyncpg.connect(DATABASE_URL, timeout=ANSWER_S)
        try:
            killed = await admin.fetchval(
                "SELECT pg_terminate_backend($1)", first["worker_pid"], timeout=ANSWER_S
            )
        finally:
            await admin.close()
        assert killed
        await publisher.publish(queue_name, {"n": 2}, message_id="second")
        await wait_for(lambda: _committed(db, "second"))

        async def rows() -> int:
            count: int = await db.fetchval("SELECT count(*) FROM effects")
            return count

        assert await settle(rows, quiet=1.0) == 2
    second = await _row(db, "second")
    assert second is not None
    assert second["worker_pid"] != first["worker_pid"]  # a new session
    assert second["body"] == ""  # a new session starts without the old one's settings


@pytest.fixture
async def pool(db: DbConnection, schema: str) -> AsyncIterator[asyncpg.Pool]:
    """One connection to the test's schema, as a batch loop's pool would hand it out."""
    pool = await asyncpg.create_pool(
        DATABASE_URL,
        min_size=1,
        max_size=1,
        timeout=ANSWER_S,
        server_settings={"search_path": schema},
    )
    yield pool
    await asyncio.wait_for(pool.close(), ANSWER_S)


async def _xmin(db: DbConnection, message_id: str) -> str:
    """The transaction that wrote `message_id`'s row."""
    xmin: str = await db.fetchval(
        "SELECT xmin::text FROM effects WHERE message_id = $1", message_id
    )
    return xmin


async def test_a_chained_commit_begins_the_next_batch_transaction_in_its_round_trip(
    db: DbConnection, pool: asyncpg.Pool
) -> None:
    held = HeldConnection(pool)
    sent: list[str] = []

    def logged(query: Any) -> None:
        sent.append(query.query)

    async with held.acquired() as conn:
        conn.add_query_logger(logged)
        tx = await held.begin(conn)
        await conn.execute(INSERT, "first", "")
        await held.commit(conn, tx, chain=True)
        assert conn.is_in_transaction()  # the next one, begun by COMMIT AND CHAIN
    committed_at = await db.fetchval("SELECT clock_timestamp()")
    async with held.acquired() as conn:
        tx = await held.begin(conn)
        began_at = await conn.fetchval("SELECT transaction_timestamp()")
        async with conn.transaction():  # a handler's savepoint works in a chained one
            await conn.execute(INSERT, "second", "")
        await held.commit(conn, tx, chain=False)
        assert not conn.is_in_transaction()
        conn.remove_query_logger(logged)
    await held.release()
    await asyncio.sleep(0)  # the query logger is called soon after each query

    controls = [q for q in sent if not q.startswith(("INSERT", "SELECT"))]
    assert [q.split()[0].rstrip(";") for q in controls] == [
        "BEGIN",
        "COMMIT",
        "SAVEPOINT",
        "RELEASE",
        "COMMIT",
    ]
    assert controls[1] == "COMMIT AND CHAIN"  # one round trip: no BEGIN of its own after it
    assert began_at < committed_at  # the second began as the first committed
    first, second = await _xmin(db, "first"), await _xmin(db, "second")
    assert first != second  # two transactions, each committed


async def test_a_chained_transaction_grown_stale_is_begun_anew(
    db: DbConnection, pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(held_module, "CHAINED_FRESH_SECONDS", 0.0)
    held = HeldConnection(pool)
    async with held.acquired() as conn:
        tx = await held.begin(conn)
        await conn.execute(INSERT, "first", "")
        await held.commit(conn, tx, chain=True)
    committed_at = await db.fetchval("SELECT clock_timestamp()")
    async with held.acquired() as conn:
        tx = await held.begin(conn)  # older than 0 s: ROLLBACK AND CHAIN
        began_at = await conn.fetchval("SELECT transaction_timestamp()")
        await conn.execute(INSERT, "second", "")
        await held.commit(conn, tx, chain=False)
    await held.release()
    assert began_at > committed_at  # now() in its handlers is the batch's own
    assert await _xmin(db, "second") != await _xmin(db, "first")


async def test_a_chained_transaction_is_rolled_back_before_its_connection_goes_back(
    db: DbConnection, pool: asyncpg.Pool
) -> None:
    held = HeldConnection(pool)
    complaints: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: complaints.append(context["message"]))
    try:
        async with held.acquired() as conn:
            tx = await held.begin(conn)
            await conn.execute(INSERT, "first", "")
            await held.commit(conn, tx, chain=True)
        await held.release()  # the loop ended with a transaction chained
        async with pool.acquire() as again:
            assert not again.is_in_transaction()
            async with again.transaction():  # asyncpg holds no transaction of ours either
                pass
    finally:
        loop.set_exception_handler(None)
    # asyncpg's reset complains of "Resetting connection with an active transaction"
    assert complaints == []
    assert await _xmin(db, "first")


async def test_chained_batches_under_load_commit_every_effect_once_with_savepoints_and_a_reject(
    db: DbConnection,
    queue_name: str,
    channel: aio_pika.abc.AbstractChannel,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chains: list[bool] = []
    commit = HeldConnection.commit

    async def counted(self: HeldConnection, conn: Any, tx: Transaction, *, chain: bool) -> None:
        chains.append(chain)
        await commit(self, conn, tx, chain=chain)

    monkeypatch.setattr(HeldConnection, "commit", counted)
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        if ctx.message_id == "m-77":
            raise Reject("bad_input")
        async with ctx.tx.transaction():  # a savepoint of the handler's own
            await ctx.tx.execute(INSERT, ctx.message_id, "")

    count = 200
    await declare(channel, queue_name, retry_policy, settings.amqp)
    for n in range(count):  # all queued first: the loop finds the next batch waiting
        await publisher.publish(queue_name, {"n": n}, message_id=f"m-{n}")
    batched = dataclasses.replace(
        settings, worker=dataclasses.replace(settings.worker, max_batch=20)
    )

    async def rows() -> int:
        counted_rows: int = await db.fetchval("SELECT count(*) FROM effects")
        return counted_rows

    async with Worker(app, batched):
        await wait_for(lambda: _at_least(rows, count - 1))
        assert await settle(rows, quiet=1.0) == count - 1
    assert any(chains), "no batch found the next one waiting"
    once: int = await db.fetchval("SELECT count(DISTINCT message_id) FROM effects")
    assert once == count - 1
    assert await db.fetchval("SELECT count(*) FROM effects WHERE message_id = 'm-77'") == 0


async def _at_least(read: Callable[[], Awaitable[int]], n: int) -> bool:
    value: int = await read()
    return value >= n
