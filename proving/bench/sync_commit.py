"""What the standby's round trip costs one batch's COMMIT, both ways interleaved.

    python -m proving.chaos.patroni_run -- python -m proving.bench.sync_commit

On the primary of DATABASE_URL (a synchronous Patroni cluster under
`patroni_run`), in a table of its own (dropped after):

1. `--connections` sessions each run `--batches` transactions in turn, one
   INSERT of `--rows` rows each (a worker's batch: its claims and effects in
   one statement's worth of WAL), alternating `SET LOCAL synchronous_commit`
   between `on` (the COMMIT waits for the standby's flush) and `local` (it
   does not), so both see the same load at the same moments.
2. Each COMMIT is timed alone; per setting: p50 and p99 of the COMMIT, and
   the batches per second one session would commit back to back at that
   setting (1 / the mean transaction time).

Line: `sync_commit: rows=… connections=… on p50=…ms p99=…ms batches/s=… local p50=… …`
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence

import asyncpg

from proving.deadlines import ANSWER_S

TABLE = f"iw_sync_commit_{os.getpid()}"
MODES = ("on", "local")


async def _session(dsn: str, batches: int, rows: int, offset: int) -> dict[str, list[float]]:
    """1. One session's batches; per setting, (commit s, transaction s) pairs flattened."""
    timings: dict[str, list[float]] = {f"{m}/{k}": [] for m in MODES for k in ("commit", "tx")}
    conn = await asyncpg.connect(dsn, timeout=ANSWER_S)
    try:
        for n in range(batches):
            mode = MODES[(n + offset) % 2]
            began = time.perf_counter()
            await conn.execute("BEGIN", timeout=ANSWER_S)
            await conn.execute(f"SET LOCAL synchronous_commit = {mode}", timeout=ANSWER_S)
            await conn.execute(
                f"INSERT INTO {TABLE} (body) SELECT repeat('x', 300) FROM generate_series(1, $1)",
                rows,
                timeout=ANSWER_S,
            )
            committing = time.perf_counter()
            await conn.execute("COMMIT", timeout=ANSWER_S)
            done = time.perf_counter()
            timings[f"{mode}/commit"].append(done - committing)
            timings[f"{mode}/tx"].append(done - began)
    finally:
        await conn.close()
    return timings


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def sync_commit(dsn: str, *, batches: int, rows: int, connections: int) -> str:
    admin = await asyncpg.connect(dsn, timeout=ANSWER_S)
    try:
        standbys = await admin.fetchval("SHOW synchronous_standby_names", timeout=ANSWER_S)
        await admin.execute(
            f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, body text)", timeout=ANSWER_S
        )
        try:
            sessions = await asyncio.wait_for(
                asyncio.gather(
                    *(_session(dsn, batches, rows, offset=i) for i in range(connections))
                ),
                timeout=ANSWER_S * batches,
            )
        finally:
            await admin.execute(f"DROP TABLE {TABLE}", timeout=ANSWER_S)
    finally:
        await admin.close()
    parts = [f"sync_commit: rows={rows} connections={connections} standbys={standbys!r}"]
    for mode in MODES:  # 2.
        commits = [t for s in sessions for t in s[f"{mode}/commit"]]
        txs = [t for s in sessions for t in s[f"{mode}/tx"]]
        parts.append(
            f"{mode} p50={_ms(commits, 0.5):.2f}ms p99={_ms(commits, 0.99):.2f}ms"
            f" batches/s={1 / statistics.fmean(txs):.0f}"
        )
    return " ".join(parts)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proving.bench.sync_commit", description=__doc__
    )
    parser.add_argument("--batches", type=int, default=2000, help="per session")
    parser.add_argument("--rows", type=int, default=100, help="per batch")
    parser.add_argument("--connections", type=int, default=4)
    args = parser.parse_args(argv)
    dsn = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    line = asyncio.run(
        sync_commit(dsn, batches=args.batches, rows=args.rows, connections=args.connections)
    )
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
