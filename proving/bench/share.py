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
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from proving.chaos.run import free_port
from proving.chaos.services import PrivatePostgres, PrivateRabbit, remove_tree

TICK = os.sysconf("SC_CLK_TCK")
CLAIMS = "SELECT coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname = $1"


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    at: float
    claims: int
    postgres_s: float
    rabbitmq_s: float
    worker_s: float


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def tree(root: int) -> list[int]:
    """`root` and its children (PostgreSQL's backends are the postmaster's children)."""
    pids = [root]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == root:
                pids.append(int(entry.name))
    return pids


class Meter:
    """CPU seconds per process, remembered so that an exited backend keeps its share."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}

    def total(self, pids: Sequence[int]) -> float:
        for pid in pids:
            self.last[pid] = max(self.last.get(pid, 0.0), cpu_seconds(pid))
        return sum(self.last.values())


async def sample(
    db: asyncpg.Connection, postmaster: int, broker: int, bench: int, meter: Meter
) -> Sample:
    claims = await db.fetchval(CLAIMS, "processed_messages")
    return Sample(
        at=time.monotonic(),
        claims=int(claims),
        postgres_s=meter.total(tree(postmaster)),
        rabbitmq_s=cpu_seconds(broker),
        worker_s=cpu_seconds(bench),
    )


def summary(samples: Sequence[Sample]) -> str:
    seconds = claims = postgres = rabbitmq = worker = 0.0
    for before, after in itertools.pairwise(samples):
        made = after.claims - before.claims
        if made <= 0:  # idle, publishing, or a dropped schema's counters
            continue
        seconds += after.at - before.at
        claims += made
        postgres += after.postgres_s - before.postgres_s
        rabbitmq += max(0.0, after.rabbitmq_s - before.rabbitmq_s)
        worker += max(0.0, after.worker_s - before.worker_s)
    if not seconds:
        return "share: no claims seen"
    return (
        f"share: claims={claims:.0f} over {seconds:.0f} s claims_per_s={claims / seconds:.0f}"
        f" postgres_cores={postgres / seconds:.2f} rabbitmq_cores={rabbitmq / seconds:.2f}"
        f" worker_cores={worker / seconds:.2f}"
        f" postgres_ms_per_1000_claims={1000 * postgres / claims * 1000:.0f}"
    )


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
            sys.executable, "-m", "consumers", "bench", *bench_args, env=env
        )
        db = await asyncpg.connect(postgres.url)
        samples: list[Sample] = []
        meter = Meter()
        try:
            while bench.returncode is None:
                samples.append(
                    await sample(db, postgres.proc.pid, rabbit.proc.pid, bench.pid, meter)
                )
                await asyncio.sleep(1.0)
        finally:
            await db.close()
            if bench.returncode is None:
                bench.kill()
            await bench.wait()
        print(summary(samples), flush=True)
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
