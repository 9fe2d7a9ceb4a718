"""The ledger reaches its rows by their primary key, whatever the table's statistics say.

A fan-out burst puts thousands of rows in `sending` between two autovacuum
runs, so the statistics still say almost none are: a planner trusting them
joined a batch's answers to a sequential scan of the whole table, once per
answer (1.3 s to record 300 answers over 10,000 rows, on every record).
"""

from __future__ import annotations

from dedupe import (
    DbConnection,
    DedupeKey,
    SendLedger,
    SendResult,
    SendStatus,
    TargetKey,
    UnknownOutcome,
    generations,
)
from dedupe.generations import FAMILIES

ROWS = 10_000
OWNER = "worker-a"


async def _stale_statistics(db: DbConnection) -> None:
    """ROWS targets analysed while `sent`, then all leased again: the statistics lag."""
    await db.execute(
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel,"
        " address, effect_id, collapse_id, status, sends)"
        " SELECT 'q', '', 'order-' || (g / 100), g % 100, 'ios', 'token-' || g,"
        "  gen_random_uuid(), 'c', 'sent', 1 FROM generate_series(0, $1 - 1) AS g",
        ROWS,
    )
    await db.execute("ANALYZE send_ledger")
    await db.execute(
        "UPDATE send_ledger SET status = 'sending', lease_owner = $1,"
        " lease_expires_at = now() + interval '30 seconds'",
        OWNER,
    )


async def _rows_scanned(db: DbConnection, schema: str) -> int:
    """Rows of send_ledger's generations read by this backend's sequential scans not yet
    flushed to the statistics (none are flushed inside a transaction: take the difference
    there). The partitioned table itself is never scanned: its generations are."""
    scanned: int = await db.fetchval(
        "SELECT sum(s.seq_tup_read)::int FROM pg_stat_xact_user_tables s"
        " JOIN pg_inherits i ON i.inhrelid = s.relid"
        " WHERE s.schemaname = $1 AND i.inhparent = $2::regclass",
        schema,
        f"{schema}.send_ledger",
    )
    return scanned


async def test_the_scan_count_sees_a_sequential_scan(db: DbConnection, schema: str) -> None:
    """The guard below can fail: a scan of every row is counted."""
    await _stale_statistics(db)
    async with db.transaction():
        before = await _rows_scanned(db, schema)
        await db.execute("SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off")
        await db.fetchval("SELECT count(*) FROM send_ledger WHERE provider_message_id = 'x'")
        assert await _rows_scanned(db, schema) - before == ROWS


async def test_recording_answers_reads_no_row_by_a_sequential_scan(
    db: DbConnection, schema: str
) -> None:
    await _stale_statistics(db)
    answers = [
        SendResult(
            target=TargetKey(
                key=DedupeKey(consumer="q", tenant="", message_id=f"order-{g // 100}"),
                target_index=g % 100,
            ),
            status=SendStatus.SENT,
            provider_message_id=f"apns-{g}",
        )
        for g in range(5_000, 5_300)
    ]

    async with db.transaction():
        before = await _rows_scanned(db, schema)
        recorded = await SendLedger(schema, OWNER).record(db, answers)
        scanned = await _rows_scanned(db, schema) - before

    assert sorted(recorded) == [a.target for a in answers]
    assert scanned == 0


async def test_taking_redelivered_jobs_reads_no_row_by_a_sequential_scan(
    db: DbConnection, schema: str
) -> None:
    # A guard: take's statements probed the key's index before this test was written.
    await _stale_statistics(db)
    await db.execute("UPDATE send_ledger SET status = 'claimed', lease_owner = NULL")
    keys = [DedupeKey(consumer="q", tenant="", message_id=f"order-{n}") for n in range(50, 53)]

    async with db.transaction():
        before = await _rows_scanned(db, schema)
        rows = await SendLedger(schema, OWNER).take(db, keys, 30.0, UnknownOutcome.SKIP)
        scanned = await _rows_scanned(db, schema) - before

    assert len(rows) == 300 and all(row.mine for row in rows)
    assert scanned == 0


async def test_recording_returns_the_answers_whose_lease_it_held(
    db: DbConnection, schema: str
) -> None:
    """The rows recorded are read back by their answer's place, not their key: the
    answers come in any order, and one whose lease another worker took is left out."""
    await db.execute(
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel,"
        " address, effect_id, collapse_id, status, sends, lease_owner, lease_expires_at)"
        " SELECT 'q', t, 'order-' || g, 0, 'ios', 'token-' || g, gen_random_uuid(), 'c',"
        "  'sending', 1, CASE WHEN g = 2 THEN 'worker-b' ELSE $1 END,"
        "  now() + interval '30 seconds'"
        " FROM generate_series(1, 4) AS g, (VALUES (''), ('acme')) AS v(t)",
        OWNER,
    )
    answers = [
        SendResult(
            target=TargetKey(
                key=DedupeKey(consumer="q", tenant=tenant, message_id=f"order-{g}"),
                target_index=0,
            ),
            status=SendStatus.SENT,
            provider_message_id=f"apns-{tenant}-{g}",
        )
        for g in (4, 2, 1, 3)
        for tenant in ("acme", "")
    ]

    async with db.transaction():
        recorded = await SendLedger(schema, OWNER).record(db, answers)

    taken_over = {a.target for a in answers if a.target.key.message_id == "order-2"}
    assert sorted(recorded) == sorted(a.target for a in answers if a.target not in taken_over)
    rows = await db.fetch(
        "SELECT tenant, message_id, provider_message_id FROM send_ledger WHERE status = 'sent'"
    )
    assert {(r[0], r[1]): r[2] for r in rows} == {
        (t.key.tenant, t.key.message_id): f"apns-{t.key.tenant}-{t.key.message_id[6:]}"
        for t in recorded
    }


async def test_answers_for_rows_of_an_older_generation_are_recorded_too(
    db: DbConnection, schema: str
) -> None:
    """Answers are looked for in the current generation first: a job written before the
    last rotation is recorded all the same, beside one written after."""
    lease = (
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel,"
        " address, effect_id, collapse_id, status, sends, lease_owner, lease_expires_at)"
        " SELECT 'q', '', $2, g, 'ios', 'token-' || g, gen_random_uuid(), 'c', 'sending', 1,"
        "  $1, now() + interval '30 seconds' FROM generate_series(0, 2) AS g"
    )
    await db.execute(lease, OWNER, "before")
    await generations.rotate_together(db, schema, FAMILIES)
    await db.execute(lease, OWNER, "after")
    answers = [
        SendResult(
            target=TargetKey(
                key=DedupeKey(consumer="q", tenant="", message_id=job), target_index=g
            ),
            status=SendStatus.SENT,
            provider_message_id=f"{job}-{g}",
        )
        for g in range(3)
        for job in ("after", "before")
    ]
    async with db.transaction():
        recorded = await SendLedger(schema, OWNER).record(db, answers)
    assert sorted(recorded) == sorted(a.target for a in answers)
    rows = await db.fetch(
        "SELECT tableoid::regclass::text, message_id, count(*) FROM send_ledger"
        " WHERE status = 'sent' GROUP BY 1, 2 ORDER BY 2"
    )
    assert [tuple(r) for r in rows] == [
        ("send_ledger_g1", "after", 3),
        ("send_ledger_g0", "before", 3),
    ]
