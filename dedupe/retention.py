"""Retention: remove dedupe rows older than the longest redelivery window.

A processed_messages row must outlive every copy of its message: a copy
redelivered after its row is gone would run again. How long that is comes
from the app's retry policies (`consumers.retention.retry_horizon`, which `run` checks);
this module only removes what is older than it is told, like this:

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
   its cost per deleted row does not grow with the table.
4. A run ends with a batch that has no lower time bound and comes back
   short: rows the cursor stepped past (out of time order on disk) are
   deleted then, and no expired row is left behind.
5. processed_messages leaves by whole generations (`dedupe.generations`), no
   DELETE: the next generation is made ahead; the current one is rotated
   once it is `rotate_every` old (a rotation the claims in flight hold up
   past its lock timeout is left to the next run); a generation that ended
   more than `keep` ago is detached and dropped, so the oldest claim lives
   at least `keep` and at most `keep` + `rotate_every` + the time between
   two runs. A claim of a push job whose sends are not all `sent` or
   `failed` is first copied into the current generation, and so outlives
   its generation (its ledger rows stay, as below).
6. A push job whose sends are not all `sent` or `failed` keeps those ledger
   rows until they are.
7. The send API's idempotency keys leave by generations too, as the claims
   (a retry later than retention makes a new message); its messages by the
   batches of 3., unless still `queued`.
8. An outbox row not yet published is kept whatever its age; published
   ones go by their `created_at`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import structlog

from dedupe import generations
from dedupe.connection import DbConnection
from dedupe.errors import DedupeError
from dedupe.generations import (
    INGRESS_KEYS,
    PROCESSED_MESSAGES,
    ROTATION_LOCK,
    RotationBusy,
    current,
)
from dedupe.migrate import quote_ident

log = structlog.get_logger(__name__)

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
    rotate_every: timedelta = timedelta(days=1)  # a generation's span (5.)

    def __post_init__(self) -> None:
        if self.keep <= timedelta(0):
            raise ValueError("retention must keep rows for a positive time")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.rotate_every <= timedelta(0):
            raise ValueError("generations must span a positive time")


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupResult:
    processed_messages: int  # rows of the generations dropped, as the planner estimated them
    send_ledger: int
    batches: int = 0
    ingress_keys: int = 0  # rows of the key generations dropped, as the planner estimated them
    ingress_messages: int = 0
    outbox: int = 0  # published outbox rows
    generations_dropped: int = 0
    generation: int = 0  # processed_messages' current generation when cleanup ended
    rotated: bool = False


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
    """Remove expired rows (generations whole, other tables batch by batch); return the counts.

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
    counts = {"sends": 0, "outbox": 0, "messages": 0, "batches": 0}
    for name, sql in (
        ("sends", _sends_batch(q)),
        ("outbox", _outbox_batch(q)),
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
    claims = await _generations(conn, schema, PROCESSED_MESSAGES, retention)
    keys = await _generations(conn, schema, INGRESS_KEYS, retention)
    return replace(
        _result(counts),
        processed_messages=claims.rows,
        generations_dropped=claims.dropped,
        generation=claims.generation,
        rotated=claims.rotated,
        ingress_keys=keys.rows,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _Swept:
    rows: int  # estimated
    dropped: int
    generation: int
    rotated: bool


async def _generations(
    conn: DbConnection, schema: str, family: generations.Family, retention: Retention
) -> _Swept:
    """Steps 5 and 7: rotate `family` when due, drop its generations past retention."""
    await generations.make_ahead(conn, schema, family)
    rotated = False
    now = await current(conn, schema, family)
    assert now.began_at is not None
    age = await conn.fetchval("SELECT now() - $1::timestamptz", now.began_at)
    if age >= retention.rotate_every:
        try:
            await generations.rotate(conn, schema, family)
        except RotationBusy as busy:
            log.info("rotation_postponed", schema=schema, table=family.table, reason=str(busy))
        else:
            rotated = True
            await generations.make_ahead(conn, schema, family)
    rows = 0.0
    gone = await generations.expired(conn, schema, family, retention.keep)
    for generation in gone:
        kept = 0
        if family is PROCESSED_MESSAGES:
            kept = await _keep_unsettled_pushes(conn, schema, generation.number)
        rows += await generations.drop(conn, schema, family, generation.number) - kept
    return _Swept(
        rows=round(rows),
        dropped=len(gone),
        generation=(await current(conn, schema, family)).number,
        rotated=rotated,
    )


async def _keep_unsettled_pushes(conn: DbConnection, schema: str, number: int) -> int:
    """Copy into the current generation the claims of `number` whose push is not settled.

    Returns how many: found by a scan of send_ledger's unsettled rows (it
    has no index on status), once per generation dropped.
    """
    q = quote_ident(schema)
    async with conn.transaction():
        # Shared, as a claim holds it: the current generation stays current meanwhile.
        await conn.execute(f"SELECT pg_advisory_xact_lock_shared({ROTATION_LOCK})", schema)
        status = await conn.execute(
            f"INSERT INTO {q}.processed_messages"
            " (generation, consumer, tenant, message_id, fingerprint, processed_at)"
            " SELECT g.generation, p.consumer, p.tenant, p.message_id, p.fingerprint,"
            "  p.processed_at"
            f" FROM (SELECT DISTINCT consumer, tenant, message_id FROM {q}.send_ledger"
            "  WHERE status NOT IN ('sent', 'failed')) AS o"
            # One probe of the generation's primary key per unsettled job, whatever
            # the planner thinks of the two tables' sizes (LIMIT keeps it a lookup).
            " CROSS JOIN LATERAL (SELECT * FROM"
            f"  {q}.{quote_ident(PROCESSED_MESSAGES.partition(number))} x"
            "  WHERE (x.consumer, x.tenant, x.message_id) = (o.consumer, o.tenant, o.message_id)"
            "  LIMIT 1) AS p"
            f" CROSS JOIN (SELECT generation FROM {q}.dedupe_generations"
            "  WHERE family = $1 AND began_at IS NOT NULL AND ended_at IS NULL) AS g"
            " ON CONFLICT DO NOTHING",
            PROCESSED_MESSAGES.table,
        )
    return int(status.split()[-1])  # "INSERT 0 n"


def _result(counts: dict[str, int]) -> CleanupResult:
    return CleanupResult(
        processed_messages=0,
        send_ledger=counts["sends"],
        batches=counts["batches"],
        ingress_messages=counts["messages"],
        outbox=counts["outbox"],
    )
