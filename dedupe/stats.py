"""How big the inbox is and how old its oldest claim, read cheaply enough to scrape.

- rows: `pg_class.reltuples`, the planner's estimate (kept by autovacuum's
  ANALYZE); 0 before the table was first analyzed. `count(*)` would read
  the whole table.
- oldest claim: `processed_at` has only a BRIN index (rows arrive in time
  order), which cannot answer `min()` without reading every range. So a
  0.1% page sample gives an upper bound first, and the BRIN index then
  reads only the ranges that hold rows at or below it: a few megabytes of
  a ten-million-row table. A table too small for the sample to hit a page
  is read whole, which is cheap at that size.
"""

from __future__ import annotations

from dataclasses import dataclass

from dedupe.connection import DbConnection
from dedupe.migrate import quote_ident


@dataclass(frozen=True, slots=True, kw_only=True)
class InboxStats:
    rows: float
    oldest_age_seconds: float | None  # None: the table is empty


async def inbox_stats(conn: DbConnection, schema: str) -> InboxStats:
    table = f"{quote_ident(schema)}.processed_messages"
    async with conn.transaction(readonly=True):
        # The bound below is a parameter: plan for its value, not generically,
        # or the planner may pick a sequential scan for an unknown bound.
        await conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        rows = await conn.fetchval(
            "SELECT greatest(c.reltuples, 0)::float8 FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = $1 AND c.relname = 'processed_messages'",
            schema,
        )
        bound = await conn.fetchval(
            f"SELECT min(processed_at) FROM {table} TABLESAMPLE SYSTEM (0.1)"
        )
        if bound is None:
            age = await conn.fetchval(
                f"SELECT extract(epoch FROM now() - min(processed_at))::float8 FROM {table}"
            )
        else:
            age = await conn.fetchval(
                f"SELECT extract(epoch FROM now() - min(processed_at))::float8 FROM {table}"
                " WHERE processed_at <= $1",
                bound,
            )
    return InboxStats(rows=float(rows or 0.0), oldest_age_seconds=age)
