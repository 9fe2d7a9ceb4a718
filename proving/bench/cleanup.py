"""`python -m proving.bench.cleanup`: how long retention takes to remove a day of claims.

Claims leave by whole generations (`dedupe.generations`). For each size N: a
schema of its own whose generation holding N claims (put in by INSERT ...
generate_series, keys in order: the setup, not what is timed) ended 8 days
ago, the next one current; VACUUM ANALYZE and a CHECKPOINT; then
`dedupe.cleanup` (keep 7 days, no rotation due) is timed removing it, and
the statements it sent are read back (asyncpg's query logger): none may be
a DELETE of processed_messages or of one of its generations. Repeated
--repeats times (a new generation each time), medians. The last line:

    cleanup: rows=0 ms=... rows=1000000 ms=... ratio=... deletes_of_claims=0

where ratio is the largest size's time over the smallest's: 1.0 is flat.
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
from dedupe import Retention, cleanup, generations, migrate, quote_ident
from dedupe.generations import PROCESSED_MESSAGES
from proving.bench.workload import TENANT
from proving.deadlines import ANSWER_S

CONSUMER = "bench.cleanup"
SETUP_TIMEOUT_S = 3600.0
RETENTION = Retention(keep=timedelta(days=7), rotate_every=timedelta(days=30))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def deletes_of_claims(statements: Sequence[str]) -> list[str]:
    """The statements among `statements` that DELETE from processed_messages or a generation."""
    return [s for s in statements if "DELETE" in s.upper() and "processed_messages" in s]


async def _expired_generation(conn: asyncpg.Connection, schema: str, rows: int) -> None:
    """`rows` claims in the current generation, then rotated and aged past retention."""
    q = quote_ident(schema)
    number = (await generations.current(conn, schema, PROCESSED_MESSAGES)).number
    part = f"{q}.{quote_ident(PROCESSED_MESSAGES.partition(number))}"
    await conn.execute(
        f"INSERT INTO {part} (consumer, tenant, message_id, fingerprint)"
        " SELECT $1, $2, lpad(i::text, 12, '0'), sha256(int8send(i))"
        " FROM generate_series(1, $3::bigint) AS i",
        CONSUMER,
        TENANT,
        rows,
        timeout=SETUP_TIMEOUT_S,
    )
    await conn.execute(f"VACUUM ANALYZE {part}", timeout=SETUP_TIMEOUT_S)
    await generations.rotate(conn, schema, PROCESSED_MESSAGES)
    await conn.execute(
        f"UPDATE {q}.dedupe_generations SET ended_at = now() - interval '8 days'"
        " WHERE family = 'processed_messages' AND generation = $1",
        number,
        timeout=ANSWER_S,
    )
    await conn.execute("CHECKPOINT", timeout=SETUP_TIMEOUT_S)


async def _one_size(url: str, size: int, repeats: int) -> tuple[list[float], list[str]]:
    """Milliseconds per cleanup, one figure per repeat; and the DELETEs of claims it sent."""
    schema = f"bench_cleanup_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(url, timeout=ANSWER_S)
    sent: list[str] = []

    def heard(logged: asyncpg.connection.LoggedQuery) -> None:
        sent.append(logged.query)

    try:
        await migrate(conn, schema)
        figures = []
        for round_ in range(repeats):
            await _expired_generation(conn, schema, size)
            conn.add_query_logger(heard)
            started = time.perf_counter()
            result = await cleanup(conn, schema, RETENTION)
            elapsed = time.perf_counter() - started
            conn.remove_query_logger(heard)
            if result.generations_dropped != 1:
                raise AssertionError(f"dropped {result.generations_dropped} generations, not 1")
            figures.append(elapsed * 1e3)
            _say(
                f"cleanup: rows={size} round={round_ + 1} dropped a generation of"
                f" {result.processed_messages:,} rows (estimated) in {figures[-1]:.1f} ms"
            )
        return figures, deletes_of_claims(sent)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S)
        await conn.close()


async def bench(url: str, sizes: Sequence[int], repeats: int) -> str:
    medians = {}
    deletes: list[str] = []
    for size in sizes:
        figures, sent = await _one_size(url, size, repeats)
        medians[size] = statistics.median(figures)
        deletes += sent
    parts = " ".join(f"rows={size} ms={medians[size]:.1f}" for size in sizes)
    ratio = medians[sizes[-1]] / medians[sizes[0]]
    return f"cleanup: {parts} ratio={ratio:.2f} deletes_of_claims={len(deletes)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.cleanup", description=__doc__)
    parser.add_argument(
        "--sizes", default="0,1000000", help="claims in the generation removed, comma-separated"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",")]
    url = Settings.from_env().database.url
    print(asyncio.run(bench(url, sizes, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
