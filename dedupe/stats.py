"""The dedupe and outbox tables' figures, read cheaply enough to scrape.

- inbox rows: `pg_class.reltuples`, the planner's estimate (kept by
  autovacuum's ANALYZE), summed over the generations (`dedupe.generations`);
  0 for a generation not analyzed yet. `count(*)` would read every one.
- oldest claim: `processed_at` has only a BRIN index (rows arrive in time
  order), which cannot answer `min()` without reading every range. So a
  0.1% page sample gives an upper bound first, and the BRIN index then
  reads only the ranges that hold rows at or below it: a few megabytes of
  a ten-million-row table. A table too small for the sample to hit a page
  is read whole, which is cheap at that size.
- outbox: pending rows counted through the partial index of pending rows,
  up to OUTBOX_COUNT_CAP (a relay down for hours must not make every
  scrape slower); the relay's lag is the age of the oldest pending row.
"""

from __future__ import annotations

from dataclasses import dataclass

from dedupe.connection import DbConnection
from dedupe.migrate import quote_ident

OUTBOX_COUNT_CAP = 100_000


@dataclass(frozen=True, slots=True, kw_only=True)
class TableStats:
    rows: float
    oldest_age_seconds: float | None  # None: the inbox is empty
    outbox_pending: int = 0  # at most OUTBOX_COUNT_CAP
    outbox_lag_seconds: float = 0.0  # the oldest pending row's age; 0 when none is pending


async def table_stats(conn: DbConnection, schema: str) -> TableStats:
    inbox = f"{quote_ident(schema)}.processed_messages"
    outbox = f"{quote_ident(schema)}.outbox"
    async with conn.transaction(readonly=True):
        # The bound below is a parameter: plan for its value, not generically,
        # or the planner may pick a sequential scan for an unknown bound.
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        rows = await conn.fetchval(
            "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::float8 FROM pg_inherits i"
            " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass",
            inbox,
        )
        bound = await conn.fetchval(
            f"SELECT min(processed_at) FROM {inbox} TABLESAMPLE SYSTEM (0.1)"
        )
        age_sql = f"SELECT extract(epoch FROM now() - min(processed_at))::float8 FROM {inbox}"
        if bound is None:
            age = await conn.fetchval(age_sql)
        else:
            age = await conn.fetchval(age_sql + " WHERE processed_at <= $1", bound)
        pending = await conn.fetchval(
            f"SELECT count(*) FROM (SELECT 1 FROM {outbox} WHERE published_at IS NULL"
            f" LIMIT {OUTBOX_COUNT_CAP}) AS p"
        )
        lag = await conn.fetchval(
            f"SELECT extract(epoch FROM now() - created_at)::float8 FROM {outbox}"
            " WHERE published_at IS NULL ORDER BY id LIMIT 1"
        )
    return TableStats(
        rows=float(rows or 0.0),
        oldest_age_seconds=age,
        outbox_pending=int(pending),
        outbox_lag_seconds=max(float(lag or 0.0), 0.0),
    )
