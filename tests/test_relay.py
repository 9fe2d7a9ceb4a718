"""The outbox relay: every committed row published with confirms, then marked."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import aio_pika
import asyncpg
import pytest

from consumers import AmqpSettings, Relay, RelaySettings, Settings
from dedupe import DbConnection, Outbox
from tests.conftest import AMQP_URL, DATABASE_URL
from tests.support import ROOT, wait_for
from tests.test_chaos_proxy import _proxy_to, _through


@pytest.fixture
async def target(channel: aio_pika.abc.AbstractChannel) -> AsyncIterator[str]:
    """A queue the relayed messages go to."""
    name = f"test.relayed.{uuid.uuid4().hex[:12]}"
    await channel.declare_queue(name, durable=True)
    yield name
    await channel.queue_delete(name)


def _relay_settings(settings: Settings, relay: RelaySettings | None = None) -> Settings:
    return replace(settings, relay=relay or RelaySettings())


async def _enqueue(
    db: DbConnection, schema: str, queue: str, ids: Sequence[str], *, per_tx: int = 100
) -> None:
    outbox = Outbox(schema)
    for start in range(0, len(ids), per_tx):
        async with db.transaction():
            for message_id in ids[start : start + per_tx]:
                await outbox.enqueue(
                    db, queue=queue, body={"id": message_id}, message_id=message_id, tenant="t"
                )


async def _pending(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM outbox WHERE published_at IS NULL")
    return count


async def _none_pending(db: DbConnection) -> bool:
    return await _pending(db) == 0


async def _claimed(db: DbConnection, prefix: str) -> int:
    """Rows of `prefix` pending and locked by a relay's open batch (SKIP LOCKED passes them)."""
    row = await db.fetchrow(
        "SELECT count(*) AS pending, (SELECT count(*) FROM (SELECT id FROM outbox"
        "  WHERE published_at IS NULL AND message_id LIKE $1 || '%' FOR UPDATE SKIP LOCKED) f)"
        " AS free FROM outbox WHERE published_at IS NULL AND message_id LIKE $1 || '%'",
        prefix,
    )
    assert row is not None
    return int(row["pending"]) - int(row["free"])


async def _take(channel: aio_pika.abc.AbstractChannel, queue: str) -> list[tuple[str, str, bytes]]:
    q = await channel.declare_queue(queue, passive=True)
    got = []
    while (m := await q.get(no_ack=True, fail=False)) is not None:
        got.append((m.message_id or "", str((m.headers or {}).get("x-tenant", "")), m.body))
    return got


async def test_relay_publishes_every_committed_row_and_marks_it(
    db: DbConnection,
    schema: str,
    settings: Settings,
    target: str,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    ids = [f"m{n}" for n in range(1_200)]
    await _enqueue(db, schema, target, ids)
    relay = Relay(_relay_settings(settings, RelaySettings(batch_size=250, concurrency=2)))
    await relay.start()
    try:
        await wait_for(lambda: _none_pending(db), timeout=60)
    finally:
        await relay.stop()
    got = await _take(channel, target)
    assert sorted(got) == sorted((i, "t", f'{{"id":"{i}"}}'.encode()) for i in ids)
    assert relay.published == 1_200


async def test_rows_of_a_transaction_that_commits_late_are_published_too(
    db: DbConnection,
    schema: str,
    settings: Settings,
    target: str,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # The late transaction takes the lower id; a cursor past the higher one
    # would never see it.
    relay = Relay(_relay_settings(settings, RelaySettings(poll_interval_s=0.2)))
    late = await asyncpg.connect(DATABASE_URL)
    await relay.start()
    try:
        async with late.transaction():
            await Outbox(schema).enqueue(late, queue=target, body={}, message_id="late")
            await _enqueue(db, schema, target, ["early"])
            await wait_for(lambda: _none_pending(db))  # "early" went out
        await wait_for(lambda: _none_pending(db))
    finally:
        await relay.stop()
        await late.close()
    assert sorted(m for m, _, _ in await _take(channel, target)) == ["early", "late"]


async def test_relay_wakes_on_the_commit_not_on_its_poll(
    db: DbConnection, schema: str, settings: Settings, target: str
) -> None:
    relay = Relay(_relay_settings(settings, RelaySettings(poll_interval_s=120)))
    await relay.start()
    try:
        await asyncio.sleep(0.1)  # the relay went idle after its first empty claim
        await _enqueue(db, schema, target, ["m1"])
        await wait_for(lambda: _none_pending(db), timeout=30)  # far below the 120 s poll
    finally:
        await relay.stop()


async def test_an_unroutable_row_stays_pending_and_the_rest_go(
    db: DbConnection,
    schema: str,
    settings: Settings,
    target: str,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    await _enqueue(db, schema, target, ["a", "b"])
    await _enqueue(db, schema, f"no.such.queue.{uuid.uuid4().hex}", ["lost?"])
    await _enqueue(db, schema, target, ["c"])
    relay = Relay(_relay_settings(settings))
    await relay.start()
    try:

        async def only_it_pending() -> bool:
            return await _pending(db) == 1 and bool(
                await db.fetchval("SELECT attempts FROM outbox WHERE message_id = 'lost?'")
            )

        await wait_for(only_it_pending, timeout=30)
    finally:
        await relay.stop()
    row = await db.fetchrow("SELECT published_at, last_error FROM outbox WHERE message_id='lost?'")
    assert row is not None and row["published_at"] is None
    assert row["last_error"].startswith("unroutable")
    assert sorted(m for m, _, _ in await _take(channel, target)) == ["a", "b", "c"]


async def test_two_relays_share_the_rows_and_publish_each_once(
    db: DbConnection,
    schema: str,
    settings: Settings,
    target: str,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    ids = [f"m{n}" for n in range(2_000)]
    relays = [
        Relay(_relay_settings(settings, RelaySettings(batch_size=50, concurrency=2)))
        for _ in range(2)
    ]
    for relay in relays:
        await relay.start()
    try:
        await _enqueue(db, schema, target, ids, per_tx=10)
        await wait_for(lambda: _none_pending(db), timeout=60)
    finally:
        for relay in relays:
            await relay.stop()
    got = [m for m, _, _ in await _take(channel, target)]
    assert sorted(got) == sorted(ids)  # no crash: none twice
    assert sum(r.published for r in relays) == 2_000


async def test_relay_command_publishes_the_outbox_and_exits_cleanly_on_sigterm(
    db: DbConnection, schema: str, target: str, tmp_path: Path
) -> None:
    await _enqueue(db, schema, target, [f"m{n}" for n in range(10)])
    env = {"AMQP_URL": AMQP_URL, "DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema}
    log = (tmp_path / "relay.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "consumers", "relay"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env},
        cwd=ROOT,
        stdout=log,
        stderr=log,
    )
    try:
        await wait_for(lambda: _none_pending(db), timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


async def test_rows_committed_while_a_batch_awaits_its_confirms_are_claimed_before_it_ends(
    db: DbConnection,
    schema: str,
    settings: Settings,
    target: str,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # Every AMQP chunk takes a second each way: the first batch waits at least
    # two for its confirms. The rows committed meanwhile must not wait for it.
    proxy = await _proxy_to(AMQP_URL, "amqp", 5672)
    slow = replace(settings, amqp=AmqpSettings(urls=(_through(AMQP_URL, proxy),)))
    relay = Relay(_relay_settings(slow, RelaySettings(concurrency=4, poll_interval_s=0.2)))
    await relay.start()
    delaying = asyncio.create_task(proxy.delay(1.0, 4.0))
    try:
        await _enqueue(db, schema, target, [f"a{n}" for n in range(10)])

        async def first_in_flight() -> bool:
            return await _claimed(db, "a") == 10

        await wait_for(first_in_flight, timeout=30)
        await _enqueue(db, schema, target, [f"b{n}" for n in range(10)])

        async def second_claimed_while_first_unconfirmed() -> bool:
            return await _claimed(db, "b") == 10 and await _claimed(db, "a") == 10

        await wait_for(second_claimed_while_first_unconfirmed, timeout=30)
        await wait_for(lambda: _none_pending(db), timeout=60)
    finally:
        await relay.stop()
        delaying.cancel()
        await proxy.close()
    got = sorted(m for m, _, _ in await _take(channel, target))
    assert got == sorted([f"a{n}" for n in range(10)] + [f"b{n}" for n in range(10)])
    assert relay.published == 20
