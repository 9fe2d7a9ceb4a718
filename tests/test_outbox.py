"""The outbox table: a row shares its caller's transaction; relays share the rows."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from dedupe import NOTIFY_CHANNEL, DbConnection, NotInTransaction, Outbox, PublishFailure
from tests.conftest import DATABASE_URL


async def test_enqueued_row_exists_only_if_the_callers_transaction_commits(
    db: DbConnection, schema: str
) -> None:
    outbox = Outbox(schema)
    async with db.transaction():
        kept = await outbox.enqueue(
            db, queue="q", body={"n": 1}, message_id="m1", tenant="acme", headers={"x-a": "b"}
        )
    with pytest.raises(RuntimeError):
        async with db.transaction():
            await outbox.enqueue(db, queue="q", body=b"raw", message_id="m2")
            raise RuntimeError("the caller's effect failed")
    rows = await db.fetch("SELECT id, queue, tenant, message_id, headers, body FROM outbox")
    assert [(r["id"], r["message_id"], r["tenant"]) for r in rows] == [(kept, "m1", "acme")]
    assert json.loads(rows[0]["body"]) == {"n": 1}
    assert json.loads(rows[0]["headers"]) == {"x-a": "b"}
    assert await outbox.pending(db) == 1


async def test_enqueue_outside_a_transaction_is_refused(db: DbConnection, schema: str) -> None:
    with pytest.raises(NotInTransaction):
        await Outbox(schema).enqueue(db, queue="q", body={}, message_id="m1")
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


async def test_enqueue_refuses_a_bad_message_id(db: DbConnection, schema: str) -> None:
    outbox = Outbox(schema)
    async with db.transaction():
        for bad in ("", "x" * 129):
            with pytest.raises(ValueError, match="message_id"):
                await outbox.enqueue(db, queue="q", body={}, message_id=bad)


async def test_two_relays_claiming_at_once_never_hold_the_same_row(
    db: DbConnection, schema: str
) -> None:
    outbox = Outbox(schema)
    async with db.transaction():
        for n in range(10):
            await outbox.enqueue(db, queue="q", body={"n": n}, message_id=f"m{n}")
    other = await asyncpg.connect(DATABASE_URL)
    try:
        async with db.transaction(), other.transaction():
            first = await outbox.claim(db, 6)
            second = await outbox.claim(other, 6)
            assert [r.message_id for r in first] == [f"m{n}" for n in range(6)]
            assert [r.message_id for r in second] == [f"m{n}" for n in range(6, 10)]
            await outbox.mark_published(other, second)
        # the first relay's transaction ended without marking: its rows are pending again
        async with db.transaction():
            again = await outbox.claim(db, 100)
        assert [r.message_id for r in again] == [f"m{n}" for n in range(6)]
    finally:
        await other.close()


async def test_a_postponed_row_is_not_claimed_before_its_delay(
    db: DbConnection, schema: str
) -> None:
    outbox = Outbox(schema)
    async with db.transaction():
        late = await outbox.enqueue(db, queue="q", body={}, message_id="late")
        await outbox.enqueue(db, queue="q", body={}, message_id="now")
    async with db.transaction():
        await outbox.postpone(db, [PublishFailure(id=late, error="unroutable", retry_after_s=60)])
    async with db.transaction():
        claimed = await outbox.claim(db, 100)
    assert [r.message_id for r in claimed] == ["now"]
    row = await db.fetchrow("SELECT attempts, last_error FROM outbox WHERE id = $1", late)
    assert row is not None and (row["attempts"], row["last_error"]) == (1, "unroutable")


async def test_relays_are_woken_when_the_enqueuing_transaction_commits(
    db: DbConnection, schema: str
) -> None:
    listener = await asyncpg.connect(DATABASE_URL)
    woken: asyncio.Queue[str] = asyncio.Queue()
    # The channel is shared by every schema on the server (other tests run
    # at the same time): count only this schema's notifications.
    await listener.add_listener(
        NOTIFY_CHANNEL, lambda *a: woken.put_nowait(a[3]) if a[3] == schema else None
    )
    try:
        async with db.transaction():
            await Outbox(schema).enqueue(db, queue="q", body={}, message_id="m1")
            await Outbox(schema).enqueue(db, queue="q", body={}, message_id="m2")
            await asyncio.sleep(0.2)
            assert woken.empty()  # nothing before the commit
        assert await asyncio.wait_for(woken.get(), timeout=10) == schema
    finally:
        await listener.close()
