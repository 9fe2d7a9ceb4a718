"""`python -m proving.bench.cleanup`: how long retention takes to remove a day of rows.

Every table that grows with traffic leaves by whole generations
(`dedupe.generations`). For each size N: a schema of its own where the
generation of every table holding N rows each (claims; their sends, all
`sent`; the send API's keys and their messages, `taken`; published outbox
rows) ended 8 days ago, the next one current. Beside them, KEPT rows that
must outlive it: unsettled sends (their claims too), queued messages,
unpublished outbox rows. All put in by INSERT ... generate_series, keys in
order: the setup, not what is timed. VACUUM ANALYZE and a CHECKPOINT; then
`dedupe.cleanup` (keep 7 days, no rotation due) is timed removing them, and
the statements it sent are read back (asyncpg's query logger): none may be a
DELETE of a table kept in generations. Repeated --repeats times (a new
generation each time), medians. The last line:

    cleanup: rows=0 ms=... rows=1000000 ms=... ratio=... deletes=0

where rows is N a table (5 N in all), and ratio is the largest size's time
over the smallest's: 1.0 is flat.
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
from dedupe.generations import FAMILIES, PROCESSED_MESSAGES
from proving.bench.workload import TENANT
from proving.deadlines import ANSWER_S

CONSUMER = "bench.cleanup"
SETUP_TIMEOUT_S = 3600.0
KEPT = 100  # rows a table that must outlive the generation (moved, not dropped)
RETENTION = Retention(keep=timedelta(days=7), rotate_every=timedelta(days=30))


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def deletes(statements: Sequence[str]) -> list[str]:
    """The statements among `statements` that DELETE from a table kept in generations."""
    return [
        s
        for s in statements
        if "DELETE" in s.upper() and any(family.table in s for family in FAMILIES)
    ]


# The setup's rows: of each table $1 (N) + $2 (KEPT: where some must outlive the
# generation), into generation $3; $4 the consumer (or queue), $5 the tenant. Keys
# name their generation: a claim kept from one round is not the next round's.
_KEY = "$3::int || '-' || lpad(i::text, 12, '0')"
_ROWS = "FROM generate_series(1, $1::bigint + $2) AS i"
_FILL = (
    "INSERT INTO processed_messages (generation, consumer, tenant, message_id, fingerprint)"
    f" SELECT $3, $4, $5, {_KEY}, sha256(int8send(i)) {_ROWS}",
    "INSERT INTO send_ledger (generation, consumer, tenant, message_id, target_index, channel,"
    " address, effect_id, collapse_id, status)"
    f" SELECT $3, $4, $5, {_KEY}, 0, 'ios', 'device', gen_random_uuid(), 'c',"
    f"  CASE WHEN i <= $2 THEN 'claimed' ELSE 'sent' END {_ROWS}",
    "INSERT INTO ingress_idempotency_keys (generation, tenant, idempotency_key, fingerprint,"
    f" message_id) SELECT $3, $5, $4 || {_KEY}, '\\x00', gen_random_uuid() {_ROWS}",
    "INSERT INTO ingress_messages (generation, id, tenant, queue, targets, status)"
    " SELECT $3, gen_random_uuid(), $5, $4, 1,"
    f"  CASE WHEN i <= $2 THEN 'queued' ELSE 'taken' END {_ROWS}",
    "INSERT INTO outbox (generation, queue, tenant, message_id, body, published_at)"
    f" SELECT $3, $4, $5, {_KEY}, '\\x00', CASE WHEN i > $2 THEN now() END {_ROWS}",
)


async def _expired_generation(conn: asyncpg.Connection, schema: str, rows: int) -> None:
    """`rows` rows a table in the current generations, then rotated and aged past retention."""
    q = quote_ident(schema)
    number = (await generations.current(conn, schema, PROCESSED_MESSAGES)).number
    await conn.execute(f"SET search_path TO {q}", timeout=ANSWER_S)
    for statement in _FILL:
        await conn.execute(statement, rows, KEPT, number, CONSUMER, TENANT, timeout=SETUP_TIMEOUT_S)
    for family in FAMILIES:
        part = f"{q}.{quote_ident(family.partition(number))}"
        await conn.execute(f"VACUUM ANALYZE {part}", timeout=SETUP_TIMEOUT_S)
    await conn.execute("RESET search_path", timeout=ANSWER_S)
    await generations.rotate_together(conn, schema, FAMILIES)
    await conn.execute(
        f"UPDATE {q}.dedupe_generations SET ended_at = now() - interval '8 days'"
        " WHERE generation = $1",
        number,
        timeout=ANSWER_S,
    )
    await conn.execute("CHECKPOINT", timeout=SETUP_TIMEOUT_S)


async def _one_size(url: str, size: int, repeats: int) -> tuple[list[float], list[str]]:
    """Milliseconds per cleanup, one figure per repeat; and the DELETEs it sent."""
    schema = f"bench_cleanup_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(url, timeout=ANSWER_S)
    sent: list[str] = []

    def heard(logged: asyncpg.connection.LoggedQuery) -> None:
        sent.append(logged.query)

    try:
        await migrate(conn, schema)
        # Generation 0 is the tables migration 0024 attached as they were, without
        # the partial indexes later generations have: leave it out of the rounds.
        await generations.rotate_together(conn, schema, FAMILIES)
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
            # Sends, messages, outbox rows, and the unsettled sends' claims: this
            # round's and, moved again, every earlier round's.
            if result.moved != 4 * KEPT * (round_ + 1):
                raise AssertionError(f"moved {result.moved} rows, not {4 * KEPT * (round_ + 1)}")
            figures.append(elapsed * 1e3)
            dropped = (
                result.processed_messages,
                result.send_ledger,
                result.ingress_keys,
                result.ingress_messages,
                result.outbox,
            )
            _say(
                f"cleanup: rows={size} round={round_ + 1} dropped a generation of each table,"
                f" {sum(dropped):,} rows (estimated), moved {result.moved},"
                f" in {figures[-1]:.1f} ms"
            )
        return figures, deletes(sent)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S)
        await conn.close()


async def bench(url: str, sizes: Sequence[int], repeats: int) -> str:
    medians = {}
    found: list[str] = []
    for size in sizes:
        figures, sent = await _one_size(url, size, repeats)
        medians[size] = statistics.median(figures)
        found += sent
    parts = " ".join(f"rows={size} ms={medians[size]:.1f}" for size in sizes)
    ratio = medians[sizes[-1]] / medians[sizes[0]]
    return f"cleanup: {parts} ratio={ratio:.2f} deletes={len(found)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.cleanup", description=__doc__)
    parser.add_argument(
        "--sizes",
        default="0,1000000",
        help="rows of each table in the generation removed, comma-separated",
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(part) for part in args.sizes.split(",")]
    url = Settings.from_env().database.url
    print(asyncio.run(bench(url, sizes, args.repeats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
