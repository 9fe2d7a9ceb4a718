"""Retention: delete dedupe rows older than the longest redelivery window.

A processed_messages row must outlive every copy of its message: a copy
redelivered after its row is gone would run again. How long that is comes
from the app's retry policies (`consumers.retention.retry_horizon`, which `run` checks);
this module only deletes what is older than it is told, like this:

1. One cleaner per schema at a time: a session advisory lock, taken with
   `pg_try_advisory_lock` (a second cleaner raises CleanerBusy at once) or,
   with `wait=True`, waited for. It is released when cleanup ends or its
   connection dies.
2. The cutoff (`now() - keep`) is fixed once, so a long run deletes no row
   that became old while it ran.
3. Each table is swept in bounded batches, one short transaction each
   (locks are held for one batch only), with a time cursor: a batch deletes
   up to `batch_size` expired rows at or after the oldest time the previous
   batch deleted, read through the BRIN index on the time column in the
   heap's order. So a batch reads the block ranges around the cursor, not
   all those earlier batches emptied nor the young rows past the cutoff, and
   its cost per deleted row does not grow with the table
   (`python -m proving.bench.cleanup` measures it).
4. A run ends with a batch that has no lower time bound and comes back
   short: rows the cursor stepped past (out of time order on disk) are
   deleted then, and no expired row is left behind.
5. A push job whose sends are not all `sent` or `failed` keeps its claim and
   those ledger rows until they are.
6. The send API's idempotency keys go after the same time (a retry later than
   that makes a new message), and its messages too, unless still `queued`.
7. An outbox row not yet published is kept whatever its age; published
   ones go by their `created_at`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dedupe.connection import DbConnection
from dedupe.errors import DedupeError
from dedupe.migrate import quote_ident

# A batch's rows must come from the BRIN index on the time column, in the
# heap's order: a sequential scan (the planner's pick for a LIMIT over a range
# it thinks is most of the table) reads every page earlier batches emptied
# again, and a full scan of the primary key index visits rows in key order,
# past which the time cursor would step. The anti-join's lookups into the
# ledger stay on its primary key, as bitmap scans.
_BRIN_ONLY = (
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off;"
    " SET LOCAL enable_indexonlyscan = off"
)
# The advisory lock's first key names the purpose; the second is the schema's hash.
_LOCK_SQL = "hashtext('idempotent-workers.cleanup'), hashtext($1)"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class CleanerBusy(DedupeError):
    """Another cleaner holds this schema's cleanup lock: one at a time is enough."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    keep: timedelta = timedelta(days=7)
    batch_size: int = 5_000

    def __post_init__(self) -> None:
        if self.keep <= timedelta(0):
            raise ValueError("retention must keep rows for a positive time")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupResult:
    processed_messages: int
    send_ledger: int
    batches: int = 0
    ingress_keys: int = 0
    ingress_messages: int = 0
    outbox: int = 0  # published outbox rows


def _sends_batch(q: str) -> str:
    return (
        f"WITH gone AS (DELETE FROM {q}.send_ledger WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.send_ledger"
        "  WHERE created_at >= $1 AND created_at < $2 AND status IN ('sent', 'failed')"
        "  LIMIT $3)) RETURNING created_at)"
        " SELECT count(*)::int AS deleted, min(created_at) AS oldest FROM gone"
    )


def _outbox_batch(q: str) -> str:
    return (
        f"WITH gone AS (DELETE FROM {q}.outbox WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.outbox"
        "  WHERE created_at >= $1 AND created_at < $2 AND published_at IS NOT NULL"
        "  LIMIT $3)) RETURNING created_at)"
        " SELECT count(*)::int AS deleted, min(created_at) AS oldest FROM gone"
    )


def _claims_batch(q: str) -> str:
    return (
        f"WITH gone AS (DELETE FROM {q}.processed_messages WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.processed_messages p"
        "  WHERE processed_at >= $1 AND processed_at < $2"
        f"  AND NOT EXISTS (SELECT 1 FROM {q}.send_ledger o"
        "   WHERE (o.consumer, o.tenant, o.message_id) = (p.consumer, p.tenant, p.message_id))"
        "  LIMIT $3)) RETURNING processed_at)"
        " SELECT count(*)::int AS deleted, min(processed_at) AS oldest FROM gone"
    )


def _ingress_keys_batch(q: str) -> str:
    return (
        f"WITH gone AS (DELETE FROM {q}.ingress_idempotency_keys WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.ingress_idempotency_keys"
        "  WHERE created_at >= $1 AND created_at < $2 LIMIT $3)) RETURNING created_at)"
        " SELECT count(*)::int AS deleted, min(created_at) AS oldest FROM gone"
    )


def _ingress_messages_batch(q: str) -> str:
    return (
        f"WITH gone AS (DELETE FROM {q}.ingress_messages WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.ingress_messages"
        "  WHERE created_at >= $1 AND created_at < $2 AND status <> 'queued'"
        "  LIMIT $3)) RETURNING created_at)"
        " SELECT count(*)::int AS deleted, min(created_at) AS oldest FROM gone"
    )


async def cleanup(
    conn: DbConnection,
    schema: str = "public",
    retention: Retention | None = None,
    progress: Callable[[CleanupResult], None] | None = None,
    *,
    wait: bool = False,
) -> CleanupResult:
    """Delete expired rows batch by batch until none is left; return the counts.

    Raises CleanerBusy if another cleaner of `schema` is running (unless `wait`).
    """
    retention = retention or Retention()
    if wait:
        await conn.execute(f"SELECT pg_advisory_lock({_LOCK_SQL})", schema)
    elif not await conn.fetchval(f"SELECT pg_try_advisory_lock({_LOCK_SQL})", schema):
        raise CleanerBusy(f"another cleaner is running on schema {schema!r}")
    try:
        return await _sweep(conn, schema, retention, progress)
    finally:
        await conn.execute(f"SELECT pg_advisory_unlock({_LOCK_SQL})", schema)


async def _sweep(
    conn: DbConnection,
    schema: str,
    retention: Retention,
    progress: Callable[[CleanupResult], None] | None,
) -> CleanupResult:
    q = quote_ident(schema)
    cutoff = await conn.fetchval("SELECT now() - $1::interval", retention.keep)
    counts = {"sends": 0, "outbox": 0, "claims": 0, "keys": 0, "messages": 0, "batches": 0}
    for name, sql in (
        ("sends", _sends_batch(q)),
        ("outbox", _outbox_batch(q)),
        ("claims", _claims_batch(q)),
        ("keys", _ingress_keys_batch(q)),
        ("messages", _ingress_messages_batch(q)),
    ):
        cursor = _EPOCH
        while True:
            async with conn.transaction():
                await conn.execute(_BRIN_ONLY)
                row = await conn.fetchrow(sql, cursor, cutoff, retention.batch_size)
            assert row is not None
            counts[name] += row["deleted"]
            counts["batches"] += 1
            if progress is not None:
                progress(_result(counts))
            if row["deleted"] == retention.batch_size:
                cursor = row["oldest"]
            elif cursor != _EPOCH:
                # A last batch with no lower bound: what the cursor stepped
                # past (rows out of time order on disk) is found here, and the
                # table holds no expired row only once such a batch comes
                # back short.
                cursor = _EPOCH
            else:
                break
    return _result(counts)


def _result(counts: dict[str, int]) -> CleanupResult:
    return CleanupResult(
        processed_messages=counts["claims"],
        send_ledger=counts["sends"],
        batches=counts["batches"],
        ingress_keys=counts["keys"],
        ingress_messages=counts["messages"],
        outbox=counts["outbox"],
    )
