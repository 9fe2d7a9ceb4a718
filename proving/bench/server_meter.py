"""What the steady bench reads on the server: WAL, CPU, the claim's own CPU.

- `ServerMeter.probe`, around each run's consuming (`Rounds.probe`): the WAL
  the server wrote (`pg_current_wal_lsn()` before and after) and the CPU time
  of the postmaster and its children, those gone included (a run's backends
  exit before it ends; the postmaster reaped them, so their time is in its
  cutime and cstime), each per message;
- `claim_cpu`: CLAIM_BATCHES batches of CLAIM_BATCH new keys claimed by
  `claim_messages()` on one connection, its backend's time on a CPU
  (/proc/PID/schedstat) per key.

CPU is read from /proc: a server not on this machine gives NaN.
"""

from __future__ import annotations

import contextlib
import statistics
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from dedupe import quote_ident
from proving.bench import schedstat
from proving.bench.rounds import Result, say
from proving.bench.share import TICK, cpu_seconds, tree
from proving.bench.stopwatch import Stopwatch
from proving.bench.variant import Variant
from proving.deadlines import ANSWER_S

CLAIM_BATCH = 500
CLAIM_BATCHES = 40


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerRun:
    """One run's server-side readings."""

    messages: int
    wal_bytes: int
    postgres_cpu_s: float

    @property
    def wal_per_message(self) -> float:
        return self.wal_bytes / self.messages

    @property
    def cpu_us_per_message(self) -> float:
        return self.postgres_cpu_s / self.messages * 1e6


@dataclass(slots=True)
class Phase:
    """A phase's results: the stopwatch's, the server's, and the sizes they ran at."""

    name: str
    results: dict[str, Result] = field(default_factory=dict)
    server: dict[str, list[ServerRun]] = field(default_factory=dict)
    rows: float = 0.0
    current_rows: float = 0.0
    claim_cpu_us: float = float("nan")

    def median(self, variant: str, figure: str) -> float:
        runs = self.server.get(variant, [])
        values = [getattr(r, figure) for r in runs]
        return statistics.median(values) if values else float("nan")


class ServerMeter:
    """WAL and CPU of the server around each run (the `probe` of `Rounds`)."""

    def __init__(self, admin: asyncpg.Connection, postmaster: int | None, watch: Stopwatch) -> None:
        self.admin = admin
        self.postmaster = postmaster
        self.watch = watch
        self.phase: Phase | None = None

    def _cpu(self) -> float:
        """CPU seconds of the postmaster and its children, those gone included.

        A run's backends exit before it ends (the worker's pool closes): the
        postmaster reaped them, so their time is in its cutime and cstime.
        NaN for a server not on this machine.
        """
        if self.postmaster is None:
            return float("nan")
        live = sum(cpu_seconds(pid) for pid in tree(self.postmaster))
        fields = Path(f"/proc/{self.postmaster}/stat").read_text().rsplit(")", 1)[1].split()
        return live + (int(fields[13]) + int(fields[14])) / TICK  # cutime, cstime

    @contextlib.asynccontextmanager
    async def probe(self, variant: Variant) -> AsyncIterator[None]:
        lsn = await self.admin.fetchval("SELECT pg_current_wal_lsn()", timeout=ANSWER_S)
        cpu = self._cpu()
        yield
        wal = await self.admin.fetchval(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", lsn, timeout=ANSWER_S
        )
        run = ServerRun(
            messages=max(self.watch.acked, 1), wal_bytes=int(wal), postgres_cpu_s=self._cpu() - cpu
        )
        assert self.phase is not None
        self.phase.server.setdefault(variant.name, []).append(run)
        say(
            f"  server: wal {run.wal_per_message:,.0f} B/msg, postgres cpu"
            f" {run.cpu_us_per_message:.0f} us/msg ({self.phase.name},"
            f" {self.phase.rows:,.0f} rows, current generation {self.phase.current_rows:,.0f})"
        )


async def claim_cpu(admin: asyncpg.Connection, schema: str, consumer: str) -> float:
    """The claim's CPU on the server, us per key: CLAIM_BATCHES batches of new keys."""
    backend = await admin.fetchval("SELECT pg_backend_pid()", timeout=ANSWER_S)
    claim = (
        f"SELECT count(*) FROM {quote_ident(schema)}.claim_messages("
        "$1::text[], $2::text[], $3::text[], $4::bytea[])"
    )
    before = schedstat.of_process(backend)
    for _ in range(CLAIM_BATCHES):
        ids = sorted(str(uuid.uuid4()) for _ in range(CLAIM_BATCH))
        async with admin.transaction():
            await admin.fetchval(
                claim,
                [consumer] * CLAIM_BATCH,
                ["acme"] * CLAIM_BATCH,
                ids,
                [b"\x01"] * CLAIM_BATCH,
                timeout=ANSWER_S,
            )
    spent = schedstat.between(before, schedstat.of_process(backend))
    if spent is None:
        return float("nan")
    return spent.ran * 1e6 / (CLAIM_BATCH * CLAIM_BATCHES)


async def server_settings(admin: asyncpg.Connection) -> str:
    names = (
        "autovacuum",
        "shared_buffers",
        "checkpoint_timeout",
        "max_wal_size",
        "wal_compression",
        "full_page_writes",
        "synchronous_commit",
    )
    values = [f"{name}={await admin.fetchval(f'SHOW {name}', timeout=ANSWER_S)}" for name in names]
    return " ".join(values)


async def postmaster(url: str) -> int | None:
    """The server's postmaster (a backend's parent); None if it is not on this machine."""
    conn = await asyncpg.connect(url, timeout=ANSWER_S)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()", timeout=ANSWER_S)
        return _parent(backend)
    except OSError:
        return None
    finally:
        await conn.close()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
