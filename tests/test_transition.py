"""dedupe.transition: of two racing compare-and-sets exactly one wins; the loser learns why."""

from __future__ import annotations

import asyncio

import asyncpg

from dedupe import DbConnection, quote_ident, transition
from tests.conftest import DATABASE_URL
from tests.support import wait_for


async def blocks_another(pid: int) -> bool:
    """Whether some session waits on a lock that backend `pid` holds."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid
        )
        return bool(waiting)
    finally:
        await conn.close()


async def approve(schema: str, refund: int, gate: asyncio.Barrier) -> str:
    """The issue's refund: approve it once, and write the payout with the approval."""
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        await conn.execute(f"SET search_path TO {quote_ident(schema)}")
        async with conn.transaction():
            await gate.wait()  # both admins click at the same moment
            moved = await transition(
                conn, "refunds", {"id": refund}, expected="pending", to="approved"
            )
            if moved.won:
                await conn.execute("INSERT INTO payouts (refund_id) VALUES ($1)", refund)
                if gate.parties > 1:  # the other admin's UPDATE waits on our row lock
                    await wait_for(lambda: blocks_another(conn.get_server_pid()), timeout=10)
                return "approved"
            if moved.already("approved"):
                return "already approved"
            return f"409 {moved.status}"
    finally:
        await conn.close()


async def test_two_admins_approve_one_refund_exactly_one_pays(
    db: DbConnection, schema: str
) -> None:
    await db.execute("CREATE TABLE refunds (id int PRIMARY KEY, status text NOT NULL)")
    await db.execute("CREATE TABLE payouts (refund_id int NOT NULL)")
    await db.execute("INSERT INTO refunds VALUES (1, 'pending'), (2, 'rejected')")
    gate = asyncio.Barrier(2)
    answers = await asyncio.gather(approve(schema, 1, gate), approve(schema, 1, gate))
    assert sorted(answers) == ["already approved", "approved"]
    assert await db.fetchval("SELECT count(*) FROM payouts") == 1
    assert await db.fetchval("SELECT status FROM refunds WHERE id = 1") == "approved"
    rejected = await approve(schema, 2, asyncio.Barrier(1))
    assert rejected == "409 rejected"
    assert await db.fetchval("SELECT count(*) FROM payouts") == 1


async def test_transition_of_a_missing_row_reports_no_status(db: DbConnection) -> None:
    await db.execute("CREATE TABLE jobs (tenant text, id int, state text, touched timestamptz)")
    await db.execute("INSERT INTO jobs VALUES ('a', 1, 'new', NULL)")
    async with db.transaction():
        missing = await transition(
            db, "jobs", {"tenant": "b", "id": 1}, expected="new", to="done", column="state"
        )
        won = await transition(
            db,
            "jobs",
            {"tenant": "a", "id": 1},
            expected=("new", "retry"),
            to="done",
            column="state",
            touch="touched",
        )
    assert (missing.won, missing.status) == (False, None)
    assert (won.won, won.status) == (True, "done")
    assert await db.fetchval("SELECT touched IS NOT NULL FROM jobs") is True
