"""An existing deployment's tables become generation 0 while claims and writes go on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest

from dedupe import (
    Claim,
    ClaimOutcome,
    DedupeKey,
    Inbox,
    Retention,
    cleanup,
    generations,
    migrate,
    quote_ident,
)
from dedupe.generations import PROCESSED_MESSAGES
from proving.deadlines import ANSWER_S, within
from tests.conftest import DATABASE_URL
from tests.support import end_generation_0, forbid_delete

BEFORE_GENERATIONS = 9  # every migration before processed_messages had generations (0010)
OLD_ROWS = 20_000
# The claim of a worker of the version before: no generation named.
OLD_CLAIM = (
    "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint)"
    " VALUES ('q', '', $1, '\\x01') ON CONFLICT DO NOTHING RETURNING true"
)


@pytest.fixture
async def old_deployment() -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    """A schema migrated by the version before generations, holding OLD_ROWS claims."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(DATABASE_URL, timeout=ANSWER_S)
    await migrate(conn, schema, upto=BEFORE_GENERATIONS)
    await conn.execute(f"SET search_path TO {quote_ident(schema)}")
    await conn.execute(
        "INSERT INTO processed_messages (consumer, tenant, message_id, fingerprint)"
        " SELECT 'q', '', 'old-' || n, '\\x01' FROM generate_series(1, $1) n",
        OLD_ROWS,
    )
    yield conn, schema
    await conn.execute(f"DROP SCHEMA {quote_ident(schema)} CASCADE")
    await conn.close()


async def _claim(conn: asyncpg.Connection, schema: str, message_id: str) -> ClaimOutcome:
    key = DedupeKey(consumer="q", tenant="", message_id=message_id)
    async with conn.transaction():
        [outcome] = await Inbox(schema).claim(conn, [Claim(key=key, fingerprint=b"\x01")])
    return outcome


async def test_migrate_makes_the_existing_table_generation_0_while_old_workers_claim(
    old_deployment: tuple[asyncpg.Connection, str],
) -> None:
    conn, schema = old_deployment
    writer = await asyncpg.connect(
        DATABASE_URL, server_settings={"search_path": schema}, timeout=ANSWER_S
    )
    migrated = asyncio.Event()
    claimed: list[str] = []

    async def old_worker() -> None:
        """Claims the old way, one key a transaction, until some after the migration."""
        after = 0
        while after < 50:
            message_id = f"during-{len(claimed)}"
            assert await writer.fetchval(OLD_CLAIM, message_id)
            claimed.append(message_id)
            after += migrated.is_set()

    try:
        claiming = asyncio.create_task(old_worker())
        while len(claimed) < 50:  # it claims before the migration starts
            await within(ANSWER_S, "the old worker's first claims", asyncio.sleep(0.01))
        applied = await migrate(conn, schema)  # every later migration comes along too
        assert applied[:3] == [10, 11, 12], applied
        migrated.set()
        await within(ANSWER_S, "the old worker's claims after the migration", claiming)
    finally:
        await writer.close()

    parts = await conn.fetch(
        "SELECT tableoid::regclass::text AS part, count(*) FROM processed_messages GROUP BY 1"
    )
    assert {r["part"]: r["count"] for r in parts} == {
        "processed_messages_g0": OLD_ROWS + len(claimed)
    }
    # What was claimed before, by either version, is a duplicate; a new key is new.
    assert await _claim(conn, schema, "old-17") is ClaimOutcome.DUPLICATE
    assert await _claim(conn, schema, claimed[-1]) is ClaimOutcome.DUPLICATE
    assert await _claim(conn, schema, "after-1") is ClaimOutcome.NEW
    # After the first rotation an old worker's claim fails instead of missing generation 0.
    await generations.rotate(conn, schema, PROCESSED_MESSAGES)
    with pytest.raises(asyncpg.CheckViolationError, match="no partition"):
        await conn.fetchval(OLD_CLAIM, "late")
    assert await _claim(conn, schema, "old-17") is ClaimOutcome.DUPLICATE


BEFORE_TABLE_GENERATIONS = 21  # every migration before the ledger, messages, outbox had them
OLD_OUTBOX = "INSERT INTO outbox (queue, message_id, body) VALUES ('q', $1, '\\x00') RETURNING id"


async def test_migrate_makes_the_ledger_messages_and_outbox_generation_0_while_writers_write(
    old_deployment: tuple[asyncpg.Connection, str],
) -> None:
    """0022-0024 on tables holding rows, with a writer of the version before inserting;
    then the first drop keeps exactly what must outlive it, with no DELETE."""
    conn, schema = old_deployment
    await migrate(conn, schema, upto=BEFORE_TABLE_GENERATIONS)
    await conn.execute(
        "INSERT INTO outbox (queue, message_id, body, published_at)"
        " SELECT 'q', 'old-' || n, '\\x00', CASE WHEN n % 10 <> 0 THEN now() END"
        " FROM generate_series(1, 1000) n;"
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel, address,"
        " effect_id, collapse_id, status)"
        " SELECT 'q', '', 'old-' || n, 0, 'ios', 't', gen_random_uuid(), 'c',"
        "  CASE WHEN n % 10 = 0 THEN 'claimed' ELSE 'sent' END FROM generate_series(1, 1000) n;"
        "INSERT INTO ingress_messages (id, tenant, queue, targets, status)"
        " SELECT gen_random_uuid(), 't', 'q', 1, CASE WHEN n % 10 = 0 THEN 'queued' ELSE 'taken'"
        "  END FROM generate_series(1, 1000) n"
    )
    writer = await asyncpg.connect(
        DATABASE_URL, server_settings={"search_path": schema}, timeout=ANSWER_S
    )
    migrated = asyncio.Event()
    ids: list[int] = []

    async def old_relay_side() -> None:
        """Inserts outbox rows the old way (no generation named) until some after 0024."""
        after = 0
        while after < 50:
            ids.append(await writer.fetchval(OLD_OUTBOX, f"during-{len(ids)}"))
            after += migrated.is_set()

    try:
        writing = asyncio.create_task(old_relay_side())
        while len(ids) < 50:
            await within(ANSWER_S, "the old writer's first rows", asyncio.sleep(0.01))
        applied = await migrate(conn, schema)
        assert applied == [22, 23, 24], applied
        migrated.set()
        await within(ANSWER_S, "the old writer's rows after the migration", writing)
    finally:
        await writer.close()
    assert len(set(ids)) == len(ids) and ids == sorted(ids)  # the parent numbers on
    for table, rows in (("outbox", 1000 + len(ids)), ("send_ledger", 1000)):
        parts = await conn.fetch(
            f"SELECT tableoid::regclass::text AS part, count(*) FROM {table} GROUP BY 1"
        )
        assert {r["part"]: r["count"] for r in parts} == {f"{table}_g0": rows}
    await conn.execute("ANALYZE outbox_g0; ANALYZE send_ledger_g0; ANALYZE ingress_messages_g0")
    await end_generation_0(conn, schema)
    await forbid_delete(conn)
    result = await cleanup(conn, schema, Retention(keep=timedelta(days=7)))
    pending = 100 + len(ids)
    assert (result.outbox, result.send_ledger, result.ingress_messages) == (900, 900, 900)
    # The unsettled sends' jobs were claimed before (the fixture's claims): copied too.
    assert result.moved == pending + 100 + 100 + 100
    assert await conn.fetchval("SELECT count(*) FROM processed_messages_g1") == 100
    for table, where, left in (
        ("outbox", "published_at IS NULL", pending),
        ("send_ledger", "status = 'claimed'", 100),
        ("ingress_messages", "status = 'queued'", 100),
    ):
        kept = await conn.fetch(
            f"SELECT tableoid::regclass::text AS part, ({where}) AS kept, count(*)"
            f" FROM {table} GROUP BY 1, 2"
        )
        assert [tuple(r) for r in kept] == [(f"{table}_g1", True, left)]
