"""The relay's promise with a real SIGKILL: published at least once, applied exactly once."""

from __future__ import annotations

import signal

from dedupe import DbConnection, Outbox
from tests.conftest import Spawn
from tests.support import settle, wait_for

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
