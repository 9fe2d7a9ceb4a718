"""`python -m proving.bench.cleanup`: retention cleanup's cost per deleted row, by table size.

For each size N: a schema of its own with EXPIRED rows 30 days old (in time
order, as a real week's claims arrive) and then N young rows (filled by
`proving.bench.prefill`: a week's worth, none expired); VACUUM ANALYZE and
a CHECKPOINT, then `dedupe.cleanup` (keep 8 days) is timed deleting the
expired rows. Repeated --repeats times (the expired rows are put back
each time), medians. The last line:

    cleanup: deleted=... batch=... rows=0 us_per_row=... rows=1000000 us_per_row=... ratio=...

where ratio is the largest size's cost per deleted row over the smallest's:
1.0 is flat.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta

import asyncpg

from consumers import Settings
from dedupe import Retention, cleanup, migrate, quote_ident
from proving.bench.prefill import prefill
from proving.bench.workload import TENANT
from proving.deadlines import ANSWER_S

CONSUMER = "bench.cleanup"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _expire(conn: asyncpg.Connection, table: str, rows: int, round_: int) -> None:
    await conn.execute(
        f"INSERT INTO {table} (consumer, tenant, message_id, fingerprint, processed_at)"
        " SELECT $1, $2, 'expired-' || $3::int || '-' || i, sha256(int8send(i)),"
        "  now() - interval '30 days' + i * interval '1 millisecond'"
        " FROM generate_series(1, $4::bigint) AS i",
        CONSUMER,
        TENANT,
        round_,
        rows,
        timeout=ANSWER_S,
    )
    await conn.execute(f"VACUUM ANALYZE {table}", timeout=ANSWER_S)
    await conn.execute("CHECKPOINT", timeout=ANSWER_S)


async def _one_size(url: str, size: int, expired: int, batch: int, repeats: int) -> list[float]:
    """Microseconds per deleted row, one figure per repeat."""
    schema = f"bench_cleanup_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(url, timeout=ANSWER_S)
    try:
        await migrate(conn, schema)
        table = f"{quote_ident(schema)}.processed_messages"
        await _expire(conn, table, expired, 0)
        if size:
            await prefill(conn, schema=schema, consumer=CONSUMER, rows=size, progress=_say)
        figures = []
        for round_ in range(repeats):
            if round_:
                await _expire(conn, table, expired, round_)
            started = time.perf_counter()
            result = await cleanup(
                conn, schema, Retention(keep=timedelta(days=8), batch_size=batch)
            )
            elapsed = time.perf_counter() - started
            if result.processed_messages != expired:
                raise AssertionError(f"deleted {result.processed_messages}, expected {expired}")
            figures.append(elapsed / expired * 1e6)
            _say(
                f"cleanup: rows={size} round={round_ + 1} deleted={expired}"
                f" in {elapsed:.2f} s ({figures[-1]:.2f} us/row, {result.batches} batches)"
            )
        return figures
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S)
        await conn.close()


async def bench(url: str, sizes: Sequence[int], expired: int, batch: int, repeats: int) -> str:
    medians = {}
    for size in sizes:
        medians[size] = statistics.median(await _one_size(url, size, expired, batch, repeats))
    parts = " ".join(f"rows={size} us_per_row={medians[size]:.2f}" for size in sizes)
    ratio = medians[sizes[-1]] / medians[sizes[0]]
    return f"cleanup: deleted={expired} batch={batch} {parts} ratio={ratio:.2f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.cleanup", description=__doc__)
    parser.add_argument(
        "--sizes", default="0,1000000", help="young rows beside the expired ones, comma-separated"
    )
    parser.add_argument("--expired", type=int, default=200_000, help="expired rows to delete")
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",")]
    url = Settings.from_env().database.url
    print(asyncio.run(bench(url, sizes, args.expired, args.batch_size, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
