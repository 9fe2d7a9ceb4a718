"""A worker on a multi-host DATABASE_URL follows a failover to the new primary.

Two real servers (`proving.chaos.replicas`): the primary turned read-only
(as a demoted primary whose sessions live on: every write answers 25006),
then the standby promoted. The worker takes the read-only error for a lost
connection, its pool reconnects through the same URL to the server that takes
writes, every message is applied there once, and the log has no traceback.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import aio_pika
import asyncpg
import pytest

from consumers import Publisher, Relay, RelaySettings, Settings
from dedupe import Outbox, quote_ident
from proving.chaos.replicas import StandbyPair
from tests.conftest import AMQP_URL, Spawn
from tests.support import WorkerProcess, no_message_ready, wait_for
from tests.test_sync_replication import prepare_effects


async def _effects(url: str, schema: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            f"SELECT message_id, count(*) AS n FROM {quote_ident(schema)}.effects"
            " GROUP BY message_id"
        )
    finally:
        await conn.close()
    return {row["message_id"]: row["n"] for row in rows}


def _reruns_on_read_only(worker: WorkerProcess) -> int:
    return sum(
        "ReadOnlySQLTransactionError" in str(r.get("error")) for r in worker.events("batch_rerun")
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_worker_on_a_multi_host_url_moves_from_a_demoted_primary_to_the_new_one(
    standby_pair: StandbyPair,
    schema: str,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
) -> None:
    pair = standby_pair
    await prepare_effects(pair.primary.url, schema)
    worker = spawn({"DATABASE_URL": pair.dsn})
    await worker.wait_logged("worker_started")
    for n in range(20):
        await publisher.publish(queue_name, {"n": n}, message_id=f"before-{n}")

    async def before_done() -> bool:
        return len(await _effects(pair.primary.url, schema)) == 20

    await wait_for(before_done, timeout=60)

    conn = await asyncpg.connect(pair.primary.url)  # the old primary takes no write from now on
    try:
        await conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()
    for n in range(20):
        await publisher.publish(queue_name, {"n": n}, message_id=f"after-{n}")

    async def refused() -> bool:
        return _reruns_on_read_only(worker) > 0

    await wait_for(refused, timeout=60)  # the worker met the demoted primary
    await pair.promote()

    async def after_done() -> bool:
        return len(await _effects(pair.standby.url, schema)) == 40

    await wait_for(after_done, timeout=120)
    effects = await _effects(pair.standby.url, schema)
    assert set(effects.values()) == {1}, effects
    assert await no_message_ready(AMQP_URL, queue_name)
    log = worker.log_text()
    assert "Traceback" not in log, log[-4000:]
    assert not worker.events("dead_lettered")


@pytest.fixture
async def target(channel: aio_pika.abc.AbstractChannel) -> AsyncIterator[str]:
    """A queue the relayed messages go to."""
    name = f"test.relayed.{uuid.uuid4().hex[:12]}"
    await channel.declare_queue(name, durable=True)
    yield name
    await channel.queue_delete(name)


def test_every_process_passes_a_multi_host_url_to_asyncpg_unchanged() -> None:
    url = "postgresql://u@h1:5432,h2:5433,h3:5434/db?target_session_attrs=read-write"
    assert Settings.from_env({"DATABASE_URL": url}).database.url == url


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_relay_on_a_multi_host_url_publishes_from_whichever_server_takes_writes(
    standby_pair: StandbyPair, schema: str, settings: Settings, target: str
) -> None:
    pair = standby_pair
    await prepare_effects(pair.primary.url, schema)
    on_pair = replace(settings, database=replace(settings.database, url=pair.dsn))
    relay = Relay(replace(on_pair, relay=RelaySettings()))
    await relay.start()
    try:
        await _enqueue(pair.primary.url, schema, target, "before")
        await wait_for(lambda: _published(pair.primary.url, schema, 10), timeout=60)
        pair.primary.kill_now()  # SIGKILL; the standby has every committed row
        await pair.promote()
        await _enqueue(pair.standby.url, schema, target, "after")
        await wait_for(lambda: _published(pair.standby.url, schema, 20), timeout=90)
    finally:
        await relay.stop()


async def _enqueue(url: str, schema: str, queue: str, prefix: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            for n in range(10):
                await Outbox(schema).enqueue(
                    conn, queue=queue, body={"n": n}, message_id=f"{prefix}-{n}", tenant="t"
                )
    finally:
        await conn.close()


async def _published(url: str, schema: str, n: int) -> bool:
    conn = await asyncpg.connect(url)
    try:
        done: int = await conn.fetchval(
            f"SELECT count(*) FROM {quote_ident(schema)}.outbox WHERE published_at IS NOT NULL"
        )
    finally:
        await conn.close()
    return done >= n
