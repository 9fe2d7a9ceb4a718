"""A batch loop keeps its database connection between batches (consumers.pipeline.held)."""

from __future__ import annotations

import asyncpg

from consumers import App, Context, Publisher, RetryPolicy, Settings, Worker
from dedupe import DbConnection
from proving.deadlines import ANSWER_S
from tests.conftest import DATABASE_URL
from tests.support import settle, wait_for

INSERT = (
    "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
    " VALUES ('x', '', $1, $2, pg_backend_pid())"
)


def _recording_app(queue: str, retry_policy: RetryPolicy) -> App:
    """Each message's effect row carries the session's backend pid and a session setting."""
    app = App(retry=retry_policy)

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        seen = await ctx.tx.fetchval("SELECT current_setting('iw_test.marker', true)")
        await ctx.tx.execute(INSERT, ctx.message_id, seen or "")
        if ctx.message_id == "first":
            await ctx.tx.execute("SET iw_test.marker TO 'kept'")  # session-wide, not LOCAL

    return app


async def _row(db: DbConnection, message_id: str) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await db.fetchrow(
        "SELECT body, worker_pid FROM effects WHERE message_id = $1", message_id
    )
    return row


async def _committed(db: DbConnection, message_id: str) -> bool:
    return await _row(db, message_id) is not None


async def test_batches_of_one_loop_share_its_connection_with_no_reset_between_them(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    async with Worker(_recording_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="first")
        await wait_for(lambda: _committed(db, "first"))
        await publisher.publish(queue_name, {"n": 2}, message_id="second")
        await wait_for(lambda: _committed(db, "second"))
    first, second = await _row(db, "first"), await _row(db, "second")
    assert first is not None and second is not None
    assert second["worker_pid"] == first["worker_pid"]  # the same session
    assert second["body"] == "kept"  # not reset in between (a pool's release runs RESET ALL)


async def test_held_connection_lost_between_batches_the_next_commits_once_on_a_new_one(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    async with Worker(_recording_app(queue_name, retry_policy), settings):
        await publisher.publish(queue_name, {"n": 1}, message_id="first")
        await wait_for(lambda: _committed(db, "first"))
        first = await _row(db, "first")
        assert first is not None
        admin = await asyncpg.connect(DATABASE_URL, timeout=ANSWER_S)
        try:
            killed = await admin.fetchval(
                "SELECT pg_terminate_backend($1)", first["worker_pid"], timeout=ANSWER_S
            )
        finally:
            await admin.close()
        assert killed
        await publisher.publish(queue_name, {"n": 2}, message_id="second")
        await wait_for(lambda: _committed(db, "second"))

        async def rows() -> int:
            count: int = await db.fetchval("SELECT count(*) FROM effects")
            return count

        assert await settle(rows, quiet=1.0) == 2
    second = await _row(db, "second")
    assert second is not None
    assert second["worker_pid"] != first["worker_pid"]  # a new session
    assert second["body"] == ""  # a new session starts without the old one's settings
