"""Fill processed_messages with millions of rows, to see what a big inbox costs.

The rows are what a week of retention leaves behind for the benched consumer:
random-looking message ids (md5 of a counter, as UUIDs), so the bench's new
keys land all over the primary key's index, as real ones do. PostgreSQL makes
them itself with generate_series, a million rows per statement; the primary
key is dropped while filling and rebuilt after (a sorted build is far cheaper
than ten million random inserts), then VACUUM ANALYZE and a CHECKPOINT leave
the table as a long-lived one is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import asyncpg

from dedupe import quote_ident
from proving.bench.workload import TENANT
from proving.deadlines import ANSWER_S

CHUNK_ROWS = 1_000_000


async def prefill(
    conn: asyncpg.Connection,
    *,
    schema: str,
    consumer: str,
    rows: int,
    progress: Callable[[str], None],
) -> float:
    """Insert `rows` claims of `consumer`; return the seconds it took."""
    table = f"{quote_ident(schema)}.processed_messages"
    started = time.perf_counter()
    await conn.execute("SET maintenance_work_mem = '512MB'", timeout=ANSWER_S)
    await conn.execute(
        f"ALTER TABLE {table} DROP CONSTRAINT processed_messages_pkey", timeout=ANSWER_S
    )
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        await conn.execute(
            f"INSERT INTO {table} (consumer, tenant, message_id, fingerprint, processed_at)"
            " SELECT $1, $2, md5('prefill' || i)::uuid::text, sha256(int8send(i)),"
            "  now() - interval '7 days' * random()"
            " FROM generate_series($3::bigint, $4::bigint) AS i",
            consumer,
            TENANT,
            start,
            stop - 1,
            timeout=ANSWER_S,
        )
        progress(f"prefill: {stop:,} of {rows:,} rows ({time.perf_counter() - started:.0f} s)")
    progress("prefill: building the primary key")
    await conn.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT processed_messages_pkey"
        " PRIMARY KEY (consumer, tenant, message_id)",
        timeout=ANSWER_S,
    )
    progress("prefill: vacuum analyze, checkpoint")
    await conn.execute(f"VACUUM ANALYZE {table}", timeout=ANSWER_S)
    await conn.execute("CHECKPOINT", timeout=ANSWER_S)
    return time.perf_counter() - started
