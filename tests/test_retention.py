"""Retention drops old generations of every table, issues no DELETE, and keeps everything
it must."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import aio_pika
import asyncpg
import pytest

from consumers import HandlerSpec, Publisher, RetentionSettings, RetryPolicy
from consumers.retention.retry_horizon import retention_need, retry_horizon
from dedupe import CleanerBusy, DbConnection, Retention, cleanup
from dedupe.generations import FAMILIES
from tests.apps.effects import FAST_RETRY
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import ROOT, end_generation_0, forbid_delete, wait_declared, wait_for


async def _seed(db: DbConnection) -> None:
    """Generation 0 of every table ended 8 days ago, with 26 claims and a push job's 2
    sends; generation 1, current, holds 5 claims."""
    schema = await db.fetchval("SELECT current_schema()")
    await db.execute(
        "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint, processed_at)"
        " SELECT 'q', '', 'old-' || n, '\\x00', now() - interval '8 days'"
        " FROM generate_series(1, 25) n"
    )
    # An old push job with one device still unsettled: it keeps its claim and that row.
    await db.execute(
        "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint, processed_at)"
        " VALUES ('p', '', 'push-old', '\\x00', now() - interval '8 days')"
    )
    await db.execute(
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel, address,"
        " effect_id, collapse_id, status, created_at) VALUES"
        " ('p', '', 'push-old', 0, 'ios', 't0', gen_random_uuid(), 'c', 'sent',"
        "  now() - interval '8 days'),"
        " ('p', '', 'push-old', 1, 'ios', 't1', gen_random_uuid(), 'c', 'claimed',"
        "  now() - interval '8 days')"
    )
    # cleanup reports the planner's count of the rows it drops
    await db.execute("ANALYZE processed_messages_g0; ANALYZE send_ledger_g0")
    await end_generation_0(db, schema)
    await db.execute(
        "INSERT INTO processed_messages (generation, consumer, tenant, message_id, fingerprint)"
        " SELECT 1, 'q', '', 'new-' || n, '\\x00' FROM generate_series(1, 5) n"
    )


async def test_the_delete_guard_of_these_tests_fails_a_delete(db: DbConnection) -> None:
    await forbid_delete(db)
    with pytest.raises(asyncpg.RaiseError, match="DELETE on outbox"):
        await db.execute("DELETE FROM outbox WHERE published_at IS NOT NULL")


async def test_cleanup_drops_the_expired_generations_and_keeps_the_rest(
    db: DbConnection, schema: str
) -> None:
    await _seed(db)
    await forbid_delete(db)
    seen = []
    result = await cleanup(db, schema, Retention(), progress=lambda r: seen.append(r))
    assert result.processed_messages == 25
    assert result.generations_dropped == 1  # of the claims; every table dropped its own
    assert result.send_ledger == 1
    assert result.moved == 2  # the unsettled send, and its job's claim
    assert len(seen) == len(FAMILIES)  # progress was reported, a generation at a time
    left = await db.fetch(
        "SELECT message_id, generation FROM processed_messages ORDER BY message_id"
    )
    # The unsettled push job's claim moved to the current generation, its send too.
    assert [tuple(r) for r in left] == [(f"new-{n}", 1) for n in (1, 2, 3, 4, 5)] + [
        ("push-old", 1)
    ]
    sends = await db.fetch("SELECT tableoid::regclass::text AS part, status FROM send_ledger")
    assert [tuple(r) for r in sends] == [("send_ledger_g1", "claimed")]
    gone = await db.fetchval(
        "SELECT count(*) FROM pg_class WHERE relname LIKE '%\\_g0' AND relnamespace ="
        " current_schema()::regnamespace"
    )
    assert gone == 0  # every generation 0 is dropped, its table and indexes with it


async def test_cleanup_drops_old_published_outbox_rows_and_keeps_pending_ones(
    db: DbConnection, schema: str
) -> None:
    await db.execute(
        "INSERT INTO outbox (queue, message_id, body, created_at, published_at)"
        " SELECT 'q', 'old-published-' || n, '\\x00', now() - interval '8 days',"
        "  now() - interval '8 days' FROM generate_series(1, 12) n"
    )
    await db.execute(
        "INSERT INTO outbox (queue, message_id, body, created_at, published_at) VALUES"
        " ('q', 'old-pending', '\\x00', now() - interval '30 days', NULL)"
    )
    await db.execute("ANALYZE outbox_g0")
    await end_generation_0(db, schema)
    await db.execute(
        "INSERT INTO outbox (queue, message_id, body, published_at)"
        " VALUES ('q', 'new-published', '\\x00', now())"
    )
    await forbid_delete(db)
    result = await cleanup(db, schema, Retention())
    assert (result.outbox, result.moved) == (12, 1)
    left = await db.fetch("SELECT message_id, generation FROM outbox ORDER BY message_id")
    assert [tuple(r) for r in left] == [("new-published", 1), ("old-pending", 1)]


async def test_cleanup_command_reports_what_it_deleted(db: DbConnection, schema: str) -> None:
    await _seed(db)
    # The send API's rows: 3 old keys, their 3 messages of which one is still queued.
    await db.execute(
        "INSERT INTO ingress_messages (generation, id, tenant, queue, targets, status, created_at)"
        " SELECT 0, gen_random_uuid(), 't', 'q', 1,"
        "  CASE WHEN n = 1 THEN 'queued' ELSE 'taken' END,"
        "  now() - interval '8 days' FROM generate_series(1, 3) n"
    )
    await db.execute("ANALYZE ingress_messages_g0")
    await db.execute(
        "INSERT INTO ingress_idempotency_keys_g0"
        " (generation, tenant, idempotency_key, fingerprint, message_id, created_at)"
        " SELECT 0, 't', 'k-' || n, '\\x00', gen_random_uuid(), now() - interval '8 days'"
        " FROM generate_series(1, 3) n"
    )
    await db.execute("ANALYZE ingress_idempotency_keys_g0")
    done = subprocess.run(
        [sys.executable, "-m", "consumers", "cleanup", "--keep-days", "7"],
        env={"DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema, "PATH": "/usr/bin"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (
        f"cleanup: schema={schema} older_than=7.0d processed_messages=25 generations_dropped=1"
        " generation=1 send_ledger=1 outbox=0 ingress_keys=3 ingress_messages=2 moved=3"
    ) in done.stdout


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consumers", *args],
        env={"DATABASE_URL": DATABASE_URL, "PATH": "/usr/bin", **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_retry_horizon_is_the_longest_tier_over_every_retry() -> None:
    assert retry_horizon(RetryPolicy()) == timedelta(hours=4)  # 4 retries, up to 3600 s each
    slow = RetryPolicy(max_attempts=10, tiers_seconds=(1.0, 86400.0))
    specs = {
        "fast": HandlerSpec(queue="fast", retry=FAST_RETRY),
        "slow": HandlerSpec(queue="slow", retry=slow),
    }
    need = retention_need(specs, RetentionSettings(replay_window_days=3), RetryPolicy())
    assert (need.queue, need.horizon, need.required) == ("slow", timedelta(days=9), timedelta(12))


async def test_run_refuses_a_retention_shorter_than_the_retry_horizon(
    db: DbConnection, spawn: Spawn, queue_name: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    worker = spawn({"IW_RETENTION_DAYS": "1", "IW_REPLAY_WINDOW_DAYS": "2"})
    await worker.expect_exit(2, timeout=60)
    said = worker.log_text()
    assert "retention (IW_RETENTION_DAYS=1) is shorter than what the handlers need" in said
    assert f"queue {queue_name!r}: 3 attempts" in said
    assert "set IW_RETENTION_DAYS to at least 2" in said
    with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):  # it never started
        await channel.declare_queue(queue_name, passive=True)


async def test_cleanup_refuses_keep_days_shorter_than_the_horizon(
    db: DbConnection, schema: str
) -> None:
    await _seed(db)
    done = _cli("cleanup", "--keep-days", "1", env={"DATABASE_SCHEMA": schema})
    assert done.returncode == 2
    assert "retention (--keep-days=1) is shorter" in done.stderr
    assert await db.fetchval("SELECT count(*) FROM processed_messages") == 31


async def test_a_second_cleaner_says_so_and_exits_0(db: DbConnection, schema: str) -> None:
    await _seed(db)
    lock = "hashtext('idempotent-workers.cleanup'), hashtext($1)"
    await db.execute(f"SELECT pg_advisory_lock({lock})", schema)
    try:
        busy = _cli("cleanup", env={"DATABASE_SCHEMA": schema})
        assert busy.returncode == 0, busy.stderr
        assert "another cleaner is running" in busy.stdout
        assert await db.fetchval("SELECT count(*) FROM processed_messages") == 31
        other = await asyncpg.connect(DATABASE_URL)
        try:
            with pytest.raises(CleanerBusy):
                await cleanup(other, schema)
        finally:
            await other.close()
    finally:
        await db.execute(f"SELECT pg_advisory_unlock({lock})", schema)
    done = _cli("cleanup", env={"DATABASE_SCHEMA": schema})
    assert done.returncode == 0, done.stderr
    assert "processed_messages=25" in done.stdout


async def test_run_cleans_up_periodically_when_asked(
    db: DbConnection, spawn: Spawn, publisher: Publisher, queue_name: str
) -> None:
    await _seed(db)
    worker = spawn({"IW_CLEANUP_INTERVAL": "0.5"})

    async def cleaned() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM processed_messages") == 6)

    await wait_for(cleaned, timeout=60)
    # The cleaner runs beside the start: see the worker consume before stopping it.
    await wait_declared(AMQP_URL, queue_name)
    await publisher.publish(queue_name, {"n": 1}, message_id="after-cleanup")

    async def consumed() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM effects") == 1)

    await wait_for(consumed, timeout=60)
    worker.terminate()
    await worker.expect_exit(0)
    assert '"event":"cleanup_done"' in worker.log_text()


async def test_a_cleaner_told_to_wait_runs_once_the_other_is_done(
    db: DbConnection, schema: str
) -> None:
    await _seed(db)
    lock = "hashtext('idempotent-workers.cleanup'), hashtext($1)"
    await db.execute(f"SELECT pg_advisory_lock({lock})", schema)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "consumers", "cleanup", "--wait"],
        env={"DATABASE_URL": DATABASE_URL, "DATABASE_SCHEMA": schema, "PATH": "/usr/bin"},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        async def queued_behind_us() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    " AND objid::int8 = hashtext($1)::int8 & 4294967295 AND classid::int8"
                    " = hashtext('idempotent-workers.cleanup')::int8 & 4294967295",
                    schema,
                )
            )

        await wait_for(queued_behind_us, timeout=60)
        assert waiting.poll() is None
        assert await db.fetchval("SELECT count(*) FROM processed_messages") == 31
    finally:
        await db.execute(f"SELECT pg_advisory_unlock({lock})", schema)
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0
    assert "processed_messages=25" in out
