"""The chaos run's fault proxy, and the worker bug it found.

The proxy sits between a client and the shared RabbitMQ or PostgreSQL and
breaks only the connections that go through it: the services themselves are
never touched.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from consumers import Publisher
from dedupe import DbConnection, quote_ident
from proving.chaos.proxy import FaultProxy
from proving.chaos.services import free_port
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import drain_dead_letters, settle, wait_for


def _through(url: str, proxy: FaultProxy) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    auth = f"{netloc[0]}@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))


async def _proxy_to(url: str, name: str, default_port: int) -> FaultProxy:
    parts = urlsplit(url)
    proxy = FaultProxy(
        name,
        free_port(),
        parts.port or default_port,
        upstream_host=parts.hostname or "127.0.0.1",
    )
    await proxy.start()
    return proxy


@pytest.fixture
async def amqp_proxy() -> AsyncIterator[FaultProxy]:
    proxy = await _proxy_to(AMQP_URL, "amqp", 5672)
    yield proxy
    await proxy.close()


@pytest.fixture
async def pg_proxy() -> AsyncIterator[FaultProxy]:
    proxy = await _proxy_to(DATABASE_URL, "postgresql", 5432)
    yield proxy
    await proxy.close()


async def _effects(db: DbConnection) -> int:
    value: int = await db.fetchval("SELECT count(*) FROM effects")
    return value


async def test_worker_resumes_consuming_after_its_broker_connection_is_reset(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    amqp_proxy: FaultProxy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # Regression: the worker got its queue with get_queue(ensure=False), which
    # the robust channel does not restore, so after any reconnect it consumed
    # nothing ever again (found by the chaos run: every message stuck).
    worker = spawn({"AMQP_URL": _through(AMQP_URL, amqp_proxy)})

    async def consuming() -> bool:
        connection = await aio_pika.connect(AMQP_URL)
        try:
            queue = await (await connection.channel()).declare_queue(queue_name, passive=True)
            return (queue.declaration_result.consumer_count or 0) > 0
        except aio_pika.exceptions.ChannelClosed:
            return False  # not declared yet
        finally:
            await connection.close()

    await wait_for(consuming, timeout=30)
    for n in range(10):
        await publisher.publish(queue_name, {"n": n}, message_id=f"before-{n}")
    await wait_for(lambda: _at_least(db, 10), timeout=30)

    assert amqp_proxy.reset() >= 1  # the worker's connection, with a RST
    for n in range(10):
        await publisher.publish(queue_name, {"n": n}, message_id=f"after-{n}")
    await wait_for(lambda: _at_least(db, 20), timeout=45)
    await settle(lambda: _effects(db), quiet=1.0)
    rows = await db.fetch("SELECT message_id, count(*) AS c FROM effects GROUP BY 1")
    assert len(rows) == 20 and all(r["c"] == 1 for r in rows)
    worker.terminate()
    await worker.expect_exit(0)
    assert await drain_dead_letters(channel, queue_name) == []


async def _at_least(db: DbConnection, n: int) -> bool:
    return await _effects(db) >= n


async def test_proxy_passes_bytes_and_adds_latency(pg_proxy: FaultProxy) -> None:
    conn = await asyncpg.connect(_through(DATABASE_URL, pg_proxy))
    try:
        assert await conn.fetchval("SELECT 41 + 1") == 42
        delaying = asyncio.create_task(pg_proxy.delay(0.2, 1.0))
        await asyncio.sleep(0.05)
        started = asyncio.get_running_loop().time()
        assert await conn.fetchval("SELECT 1") == 1
        assert asyncio.get_running_loop().time() - started >= 0.35  # both directions
        await delaying
    finally:
        await conn.close()


async def test_proxy_reset_breaks_open_connections(pg_proxy: FaultProxy) -> None:
    conn = await asyncpg.connect(_through(DATABASE_URL, pg_proxy))
    assert pg_proxy.reset() == 1
    with pytest.raises((OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError)):
        await conn.fetchval("SELECT 1")
    conn.terminate()


async def test_proxy_hold_stalls_traffic_then_resets(pg_proxy: FaultProxy) -> None:
    conn = await asyncpg.connect(_through(DATABASE_URL, pg_proxy))
    holding = asyncio.create_task(pg_proxy.hold(1.0))
    await asyncio.sleep(0.05)
    with pytest.raises(TimeoutError):
        await conn.fetchval("SELECT 1", timeout=0.5)  # no answer, no error: half-open
    await holding
    conn.terminate()
    again = await asyncpg.connect(_through(DATABASE_URL, pg_proxy))
    assert await again.fetchval("SELECT 1") == 1
    await again.close()


async def test_commit_cut_leaves_the_client_without_an_answer(
    pg_proxy: FaultProxy, schema: str
) -> None:
    admin = await asyncpg.connect(DATABASE_URL)
    await admin.execute(f"CREATE SCHEMA {quote_ident(schema)}")
    table = f"{quote_ident(schema)}.cut"
    await admin.execute(f"CREATE TABLE {table} (n integer)")
    try:
        conn = await asyncpg.connect(_through(DATABASE_URL, pg_proxy))
        pg_proxy.arm_commit_cut()
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f"INSERT INTO {table} VALUES (1)")
        with pytest.raises((OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError)):
            await tx.commit()
        assert pg_proxy.cuts_done == 1
        conn.terminate()
        # The outcome is unknown to the client; the server decided one way or
        # the other, and only once.
        await asyncio.sleep(0.2)
        assert await admin.fetchval(f"SELECT count(*) FROM {table}") in (0, 1)
    finally:
        await admin.execute(f"DROP SCHEMA {quote_ident(schema)} CASCADE")
        await admin.close()
