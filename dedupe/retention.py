"""Retention: remove rows older than the longest redelivery window, by whole tables.

A processed_messages row must outlive every copy of its message: a copy
redelivered after its row is gone would run again. How long that is comes
from the app's retry policies (`consumers.retention.retry_horizon`, which `run` checks);
this module only removes what is older than it is told, like this:

1. One cleaner per schema at a time: a session advisory lock, taken with
   `pg_try_advisory_lock` (a second cleaner raises CleanerBusy at once) or,
   with `wait=True`, waited for. It is released when cleanup ends or its
   connection dies.
2. Every table that grows with traffic leaves by whole generations
   (`dedupe.generations`), never by DELETE: the claims, the send ledger, the
   send API's idempotency keys and messages, the outbox. The next generation
   of each is made ahead; once the claims' current generation is
   `rotate_every` old, every family rotates, in one transaction (a rotation
   the claims in flight hold up past its lock timeout is left to the next
   run); a generation that ended more than `keep` ago is dropped (detached,
   its table dropped), so the oldest row lives at least `keep` and at most
   `keep` + `rotate_every` + the time between two runs.
3. A send not `sent` or `failed` moves to the current generation of the
   ledger when its own is dropped, and its job's claim is copied into the
   current generation of the claims before the claim's is: a job that may
   still be sent keeps both, however old.
4. A send API message still `queued`, and an outbox row not yet published,
   move to their table's current generation the same way: kept whatever
   their age. The send API's idempotency keys leave with their generation (a
   retry later than retention makes a new message).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import structlog

from dedupe import generations
from dedupe.connection import DbConnection
from dedupe.errors import DedupeError
from dedupe.generations import (
    FAMILIES,
    INGRESS_KEYS,
    INGRESS_MESSAGES,
    OUTBOX,
    PROCESSED_MESSAGES,
    ROTATION_LOCK,
    SEND_LEDGER,
    UNSETTLED,
    RotationBusy,
    current,
)
from dedupe.migrate import quote_ident

log = structlog.get_logger(__name__)

# The advisory lock's first key names the purpose; the second is the schema's hash.
_LOCK_SQL = "hashtext('idempotent-workers.cleanup'), hashtext($1)"


class CleanerBusy(DedupeError):
    """Another cleaner holds this schema's cleanup lock: one at a time is enough."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    keep: timedelta = timedelta(days=7)
    rotate_every: timedelta = timedelta(days=1)  # a generation's span (2.)

    def __post_init__(self) -> None:
        if self.keep <= timedelta(0):
            raise ValueError("retention must keep rows for a positive time")
        if self.rotate_every <= timedelta(0):
            raise ValueError("generations must span a positive time")


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupResult:
    """Rows of the generations dropped, by table, as the planner estimated them.

    Rows moved to a current generation (3., 4.) are not counted.
    """

    processed_messages: int = 0
    send_ledger: int = 0
    ingress_keys: int = 0
    ingress_messages: int = 0
    outbox: int = 0
    moved: int = 0  # rows that outlived their generation: moved, or claims copied (3., 4.)
    generations_dropped: int = 0  # of processed_messages (the others' go with them)
    generation: int = 0  # processed_messages' current generation when cleanup ended
    rotated: bool = False


# The CleanupResult field of each family's rows.
_FIELD = {
    PROCESSED_MESSAGES.table: "processed_messages",
    SEND_LEDGER.table: "send_ledger",
    INGRESS_KEYS.table: "ingress_keys",
    INGRESS_MESSAGES.table: "ingress_messages",
    OUTBOX.table: "outbox",
}


async def cleanup(
    conn: DbConnection,
    schema: str = "public",
    retention: Retention | None = None,
    progress: Callable[[CleanupResult], None] | None = None,
    *,
    wait: bool = False,
) -> CleanupResult:
    """Drop the generations past retention, rotating first when due; return the counts.

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
    for family in FAMILIES:
        await generations.make_ahead(conn, schema, family)
    result = CleanupResult(rotated=await _rotate_if_due(conn, schema, retention))
    for family in FAMILIES:
        for generation in await generations.expired(conn, schema, family, retention.keep):
            kept = 0
            if family is PROCESSED_MESSAGES:
                kept = await _keep_unsettled_pushes(conn, schema, generation.number)
            dropped = await generations.drop(conn, schema, family, generation.number)
            field = _FIELD[family.table]
            result = replace(
                result,
                **{field: getattr(result, field) + max(dropped.rows - kept, 0)},
                moved=result.moved + dropped.moved + kept,
                generations_dropped=result.generations_dropped + (family is PROCESSED_MESSAGES),
            )
            log.info(
                "generation_dropped",
                schema=schema,
                table=family.table,
                generation=generation.number,
                rows=dropped.rows,
                moved=dropped.moved + kept,
            )
            if progress is not None:
                progress(result)
    now = await current(conn, schema, PROCESSED_MESSAGES)
    return replace(result, generation=now.number)


async def _rotate_if_due(conn: DbConnection, schema: str, retention: Retention) -> bool:
    """Rotate every family once the claims' current generation is `rotate_every` old (2.)."""
    now = await current(conn, schema, PROCESSED_MESSAGES)
    assert now.began_at is not None
    age = await conn.fetchval("SELECT now() - $1::timestamptz", now.began_at)
    if age < retention.rotate_every:
        return False
    try:
        await generations.rotate_together(conn, schema, FAMILIES)
    except RotationBusy as busy:
        log.info("rotation_postponed", schema=schema, reason=str(busy))
        return False
    for family in FAMILIES:
        await generations.make_ahead(conn, schema, family)
    return True


async def _keep_unsettled_pushes(conn: DbConnection, schema: str, number: int) -> int:
    """Copy into the current generation the claims of `number` whose push is not settled.

    Returns how many: found through each ledger generation's partial index on
    its unsettled rows (generation 0 of an upgraded deployment has none, and is
    read whole), once per generation dropped.
    """
    q = quote_ident(schema)
    async with conn.transaction():
        # Shared, as a claim holds it: the current generation stays current meanwhile.
        await conn.execute(f"SELECT pg_advisory_xact_lock_shared({ROTATION_LOCK})", schema)
        status = await conn.execute(
            f"INSERT INTO {q}.processed_messages"
            " (generation, consumer, tenant, message_id, fingerprint, processed_at)"
            f" SELECT {generations.current_sql(schema, PROCESSED_MESSAGES)}, p.consumer,"
            "  p.tenant, p.message_id, p.fingerprint, p.processed_at"
            f" FROM (SELECT DISTINCT consumer, tenant, message_id FROM {q}.send_ledger"
            f"  WHERE {UNSETTLED}) AS o"
            # One probe of the generation's primary key per unsettled job, whatever
            # the planner thinks of the two tables' sizes (LIMIT keeps it a lookup).
            " CROSS JOIN LATERAL (SELECT * FROM"
            f"  {q}.{quote_ident(PROCESSED_MESSAGES.partition(number))} x"
            "  WHERE (x.consumer, x.tenant, x.message_id) = (o.consumer, o.tenant, o.message_id)"
            "  LIMIT 1) AS p"
            " ON CONFLICT DO NOTHING"
        )
    return int(status.split()[-1])  # "INSERT 0 n"
