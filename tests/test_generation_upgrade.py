"""An existing deployment's processed_messages becomes generation 0 while claims go on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from dedupe import Claim, ClaimOutcome, DedupeKey, Inbox, generations, migrate, quote_ident
from dedupe.generations import PROCESSED_MESSAGES
from proving.deadlines import ANSWER_S, within
from tests.conftest import DATABASE_URL

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
