"""The bench on a PostgreSQL and a RabbitMQ of its own, with their CPU shares.

    python -m proving.bench.share -- --variants framework --paced-seconds 0

Starts a private PostgreSQL and a private RabbitMQ node (proving.chaos.services,
on free ports, their files in a temporary directory), runs
`idempotent-workers bench` with the given options against them, and every
second reads

    claims     inserts into processed_messages (pg_stat_user_tables)
    postgres   CPU time of the postmaster and every backend, from /proc
    rabbitmq   CPU time of the broker's Erlang VM
    worker     CPU time of the bench process (the worker runs in it)

Over the seconds in which claims were made it prints one line: claims per
second and the CPU each used, in cores. Nothing else uses those services, so
their CPU is the bench's alone; the machine's other load is not.
"""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from dedupe import quote_ident
from proving.chaos.services import PrivatePostgres, PrivateRabbit, free_port, remove_tree
from proving.deadlines import ANSWER_S

TICK = os.sysconf("SC_CLK_TCK")
TABLES = (
    "SELECT table_schema FROM information_schema.tables WHERE table_name = 'processed_messages'"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    at: float
    claims: int
    postgres_s: float
    rabbitmq_s: float
    worker_s: float


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def tree(root: int) -> list[int]:
    """`root` and all its descendants (backends; a supervisor's worker processes)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


class Meter:
    """CPU seconds per process, remembered so that an exited backend keeps its share."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}

    def total(self, pids: Sequence[int]) -> float:
        for pid in pids:
            self.last[pid] = max(self.last.get(pid, 0.0), cpu_seconds(pid))
        return sum(self.last.values())


async def claims_now(db: asyncpg.Connection) -> int:
    """Committed rows in every schema's processed_messages (a count, not lagging statistics)."""
    schemas = [r["table_schema"] for r in await db.fetch(TABLES, timeout=ANSWER_S)]
    if not schemas:
        return 0
    counts = " + ".join(
        f"(SELECT count(*) FROM {quote_ident(s)}.processed_messages)" for s in schemas
    )
    try:
        return int(await db.fetchval(f"SELECT {counts}", timeout=ANSWER_S))
    except asyncpg.UndefinedTableError:  # a schema dropped between the two statements
        return 0


async def sample(
    db: asyncpg.Connection, postmaster: int, broker: int, bench: int, meters: tuple[Meter, Meter]
) -> Sample:
    return Sample(
        at=time.monotonic(),
        claims=await claims_now(db),
        postgres_s=meters[0].total(tree(postmaster)),
        rabbitmq_s=cpu_seconds(broker),
        worker_s=meters[1].total(tree(bench)),
    )


@dataclass(slots=True)
class Totals:
    seconds: float = 0.0
    claims: float = 0.0
    postgres: float = 0.0
    rabbitmq: float = 0.0
    worker: float = 0.0

    def add(self, before: Sample, after: Sample) -> None:
        self.seconds += after.at - before.at
        self.claims += after.claims - before.claims
        self.postgres += after.postgres_s - before.postgres_s
        self.rabbitmq += max(0.0, after.rabbitmq_s - before.rabbitmq_s)
        self.worker += max(0.0, after.worker_s - before.worker_s)

    def line(self, label: str) -> str:
        s = self.seconds
        return (
            f"share: {label} claims={self.claims:.0f} seconds={s:.0f}"
            f" claims_per_s={self.claims / s:.0f} postgres_cores={self.postgres / s:.2f}"
            f" rabbitmq_cores={self.rabbitmq / s:.2f} worker_cores={self.worker / s:.2f}"
            f" postgres_cpu_us_per_claim={1e6 * self.postgres / self.claims:.0f}"
        )


def summary(samples: Sequence[Sample]) -> list[str]:
    """One line per burst of claims (a bench run's consuming phase), then all of them."""
    bursts: list[Totals] = []
    open_burst: Totals | None = None
    for before, after in itertools.pairwise(samples):
        if after.claims - before.claims <= 0:  # idle, publishing, or a dropped schema
            open_burst = None
            continue
        if open_burst is None:
            open_burst = Totals()
            bursts.append(open_burst)
        open_burst.add(before, after)
    if not bursts:
        return ["share: no claims seen"]
    every = Totals(
        seconds=sum(b.seconds for b in bursts),
        claims=sum(b.claims for b in bursts),
        postgres=sum(b.postgres for b in bursts),
        rabbitmq=sum(b.rabbitmq for b in bursts),
        worker=sum(b.worker for b in bursts),
    )
    return [b.line(f"burst={n + 1}") for n, b in enumerate(bursts)] + [every.line("all")]


async def measure(bench_args: Sequence[str]) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="iw-share-"))
    os.chmod(workdir, 0o755)  # the private PostgreSQL runs as the postgres user
    postgres = PrivatePostgres(workdir / "postgres", free_port())
    rabbit = PrivateRabbit(workdir / "rabbitmq", free_port(), free_port())
    try:
        postgres.init()
        await asyncio.gather(postgres.start(), rabbit.start())
        assert postgres.proc is not None and rabbit.proc is not None
        env = {**os.environ, "DATABASE_URL": postgres.url, "AMQP_URL": rabbit.url}
        bench = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "consumers",
            "bench",
            *bench_args,
            env=env,
            preexec_fn=_die_with_parent,  # a killed measurement leaves no bench behind
        )
        db = await asyncpg.connect(postgres.url, timeout=ANSWER_S)
        samples: list[Sample] = []
        meters = (Meter(), Meter())
        try:
            while bench.returncode is None:
                samples.append(
                    await sample(db, postgres.proc.pid, rabbit.proc.pid, bench.pid, meters)
                )
                await asyncio.sleep(1.0)
        finally:
            await db.close()
            if bench.returncode is None:
                bench.kill()
            await asyncio.wait_for(bench.wait(), ANSWER_S)
        for line in summary(samples):
            print(line, flush=True)
        return bench.returncode or 0
    finally:
        await asyncio.gather(postgres.stop(), rabbit.stop())
        postgres.kill_now()
        rabbit.kill_now()
        remove_tree(workdir)


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    return asyncio.run(measure(args))


if __name__ == "__main__":
    sys.exit(main())
