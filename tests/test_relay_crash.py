"""The relay's promise with a real SIGKILL: published at least once, applied exactly once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from pathlib import Path

import aio_pika

from consumers import Relay, RelaySettings, Settings
from dedupe import DbConnection, Outbox
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import ROOT, settle, wait_for
from tests.test_chaos_proxy import _proxy_to, _through
from tests.test_relay import _claimed, _enqueue, _take

ROWS = 300
BATCH = 100


async def _count(db: DbConnection, sql: str) -> int:
    value: int = await db.fetchval(sql)
    return value


async def test_relay_killed_between_publish_and_mark_publishes_again_and_effects_apply_once(
    db: DbConnection, schema: str, queue_name: str, spawn: Spawn
) -> None:
    # The sample app's own queue is the outbox's target: the process that
    # relays (IW_RELAY=1 inside `run`) also consumes, with its dedupe.
    outbox = Outbox(schema)
    async with db.transaction():
        for n in range(ROWS):
            await outbox.enqueue(db, queue=queue_name, body={"n": n}, message_id=f"job-{n}")
    relay_env = {"IW_RELAY": "1", "IW_RELAY_BATCH": str(BATCH), "IW_RELAY_CONCURRENCY": "1"}

    first = spawn({**relay_env, "PROVING_CRASH_AT": "after_publish"})
    # Its first batch was confirmed by the broker, then the process died before the mark.
    await first.expect_exit(-signal.SIGKILL, timeout=60)
    pending = "SELECT count(*) FROM outbox WHERE published_at IS NULL"
    assert await _count(db, pending) == ROWS  # nothing marked: the batch died with its transaction

    second = spawn(relay_env)

    async def all_published_and_applied() -> bool:
        return (
            await _count(db, pending) == 0
            and await _count(db, "SELECT count(*) FROM effects") >= ROWS
        )

    await wait_for(all_published_and_applied, timeout=90)
    await settle(lambda: _count(db, "SELECT count(*) FROM effects"), quiet=1.0)
    second.terminate()
    await second.expect_exit(0, timeout=60)

    # Every enqueued row published at least once...
    assert await _count(db, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL") == ROWS
    # ...the killed batch twice: its first copies were absorbed as duplicates...
    assert second.log_text().count("duplicate_ignored") >= BATCH
    # ...and every effect downstream exactly once.
    rows = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert len(rows) == ROWS
    assert {r["n"] for r in rows} == {1}


async def test_relay_killed_with_batches_in_flight_loses_none_of_their_rows(
    db: DbConnection,
    schema: str,
    settings: Settings,
    channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    target = f"test.relayed.{uuid.uuid4().hex[:12]}"
    await channel.declare_queue(target, durable=True)
    ids = [f"job-{n}" for n in range(ROWS)]
    # The relay's AMQP is slowed (a second a chunk each way), so its batches
    # sit awaiting their confirms, several at once, when the SIGKILL comes.
    proxy = await _proxy_to(AMQP_URL, "amqp", 5672)
    env = {
        "AMQP_URL": _through(AMQP_URL, proxy),
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": schema,
        "IW_RELAY_BATCH": "50",
        "IW_RELAY_CONCURRENCY": "4",
        "IW_RELAY_POLL": "0.2",
    }
    log = (tmp_path / "relay.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumers", "relay"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    delaying = asyncio.create_task(proxy.delay(1.0, 600))
    try:
        await _enqueue(db, schema, target, ids, per_tx=BATCH)

        async def batches_in_flight() -> bool:
            return await _claimed(db, "job-") >= 2 * 50

        await wait_for(batches_in_flight, timeout=60)
        proc.kill()
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        delaying.cancel()
        await proxy.close()

    # Its transactions die with it (once PostgreSQL sees the connection
    # gone): whatever it had not marked is pending and free again.
    async def locks_gone() -> bool:
        return await _claimed(db, "job-") == 0

    await wait_for(locks_gone, timeout=30)

    relay = Relay(replace(settings, relay=RelaySettings(batch_size=BATCH)))
    await relay.start()
    try:

        async def all_published() -> bool:
            return await _count(db, "SELECT count(*) FROM outbox WHERE published_at IS NULL") == 0

        await wait_for(all_published, timeout=60)
    finally:
        await relay.stop()
    got = {m for m, _, _ in await _take(channel, target)}
    await channel.queue_delete(target)
    assert got == set(ids)  # every row on the broker at least once
