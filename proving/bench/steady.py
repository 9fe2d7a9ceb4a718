"""The worker at production's steady state, beside itself on empty tables.

    python -m proving.bench.steady [--rows 5000000] [--days 7] [--generation-hours 24]
                                   [--messages 20000] [--repeats 3]

Every headline figure of `bench` runs on an empty `processed_messages`; in
production it holds the whole retention window. This command measures both,
in one process, interleaved as `bench` does (`proving.bench.rounds`):

1. A PostgreSQL of its own (`proving.chaos.services.PrivatePostgres`, its
   files in a temporary directory, removed after; autovacuum on, as
   PostgreSQL ships it; --shared-buffers), so that the WAL and the CPU read
   below are this bench's alone; `--database-url` uses another server
   instead (its WAL and CPU then count everyone's). RabbitMQ: AMQP_URL's.
2. The sandbox schema migrated as `migrate` does, and an `effects` table
   with an index on the message's key, emptied before each run (the user's
   table stays the same size in both phases: what changes is ours).
3. Phase `empty`: --repeats runs of each variant (--messages each, a
   backlog consumed at full speed, logs at info to --log-file), the claims
   emptied before each run.
4. The prefill (`proving.bench.steady_fill`): --rows claims over the
   generations a retention of --days keeps at --generation-hours each, put
   in by COPY, at the rate that leaves them; then VACUUM ANALYZE and a
   CHECKPOINT. The disk it needs is checked first.
5. Phase `prefilled`: the same runs, the claims kept.

For each run, around its consuming (after the backlog is published and a
CHECKPOINT): the WAL the server wrote (`pg_current_wal_lsn()` before and
after) and the CPU time of every PostgreSQL process (/proc), each per
message. After each phase, the claim's own CPU on the server: batches of
CLAIM_BATCH new keys claimed by `claim_messages()` on one connection, its
backend's time on a CPU (/proc/PID/schedstat) per key. Every figure names
the rows in processed_messages and in its current generation when it was
taken (the planner's estimates). The closing line is each variant's
prefilled figures over its empty ones.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import aio_pika
import asyncpg

from consumers import Settings, configure_logging
from consumers.broker.frames import install as install_frame_reader
from consumers.runtime.collector import collect_less
from dedupe import generations, quote_ident, table_stats
from dedupe.generations import PROCESSED_MESSAGES
from proving.bench import catalog
from proving.bench.options import DEFAULT_LOG_FILE, BenchOptions
from proving.bench.rounds import Rounds, say, since
from proving.bench.sandbox import Sandbox
from proving.bench.server_meter import (
    Phase,
    ServerMeter,
    claim_cpu,
    postmaster,
    server_settings,
)
from proving.bench.steady_fill import BYTES_PER_ROW, fill, plan
from proving.bench.stopwatch import Stopwatch
from proving.bench.variant import Variant
from proving.chaos.services import PrivatePostgres, free_port, remove_tree
from proving.deadlines import ANSWER_S, within

VARIANTS = ("handwritten", "framework")


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    rows: int
    days: float
    generation_hours: float
    messages: int
    repeats: int
    variants: tuple[str, ...]
    database_url: str | None  # None: a private PostgreSQL
    shared_buffers: str
    log_file: str


async def _sizes(admin: asyncpg.Connection, schema: str) -> tuple[float, float]:
    """(rows in processed_messages, rows in its current generation): estimates."""
    await admin.execute(f"ANALYZE {quote_ident(schema)}.processed_messages", timeout=ANSWER_S)
    rows = (await table_stats(admin, schema)).rows
    now = await generations.current(admin, schema, PROCESSED_MESSAGES)
    current = await admin.fetchval(
        "SELECT greatest(reltuples, 0)::float8 FROM pg_class WHERE oid = $1::regclass",
        f"{quote_ident(schema)}.{quote_ident(PROCESSED_MESSAGES.partition(now.number))}",
        timeout=ANSWER_S,
    )
    return rows, float(current or 0.0)


def _ms(value: float) -> str:
    return f"{value:.1f}"


def report(phases: Sequence[Phase], variants: Sequence[str]) -> list[str]:
    lines = []
    for phase in phases:
        for name in variants:
            result = phase.results.get(name)
            if result is None:
                continue
            lines.append(
                f"steady: phase={phase.name} rows={phase.rows:.0f}"
                f" current_generation_rows={phase.current_rows:.0f} variant={name}"
                f" rate={result.rate:.0f} p50_ms={_ms(result.p50_ms)} p99_ms={_ms(result.p99_ms)}"
                f" wal_bytes_per_msg={phase.median(name, 'wal_per_message'):.0f}"
                f" postgres_cpu_us_per_msg={phase.median(name, 'cpu_us_per_message'):.0f}"
                f" claim_cpu_us_per_key={phase.claim_cpu_us:.1f}"
            )
    if len(phases) == 2:
        empty, full = phases
        for name in variants:
            if name not in empty.results or name not in full.results:
                continue
            e, f = empty.results[name], full.results[name]
            wal = full.median(name, "wal_per_message") / empty.median(name, "wal_per_message")
            lines.append(
                f"steady: {name} prefilled/empty at rows={full.rows:.0f}:"
                f" rate={f.rate / e.rate:.2f} p99={f.p99_ms / e.p99_ms:.2f} wal={wal:.2f}"
                f" claim_cpu={full.claim_cpu_us / empty.claim_cpu_us:.2f}"
            )
    return lines


async def _phase(
    rounds: Rounds,
    meter: ServerMeter,
    admin: asyncpg.Connection,
    sandbox: Sandbox,
    variants: list[Variant],
    name: str,
) -> Phase:
    phase = Phase(name=name)
    if name == "empty":
        await admin.execute(
            f"TRUNCATE {quote_ident(sandbox.schema)}.processed_messages", timeout=ANSWER_S
        )
    phase.rows, phase.current_rows = await _sizes(admin, sandbox.schema)
    meter.phase = phase
    phase.results = await rounds.rounds(variants, keep_claims=name != "empty", phase=name)
    phase.claim_cpu_us = await claim_cpu(admin, sandbox.schema, sandbox.queue)
    say(f"  claim: {phase.claim_cpu_us:.1f} us of server CPU per key ({name})")
    return phase


async def steady(options: Options, settings: Settings, url: str, postmaster: int | None) -> int:
    started = time.monotonic()
    install_frame_reader()
    sandbox = Sandbox.fresh(settings.amqp)
    database = replace(settings.database, url=url, schema=sandbox.schema)
    worker_settings = replace(settings, database=database)
    admin = await asyncpg.connect(url, timeout=ANSWER_S)
    connection = await aio_pika.connect(settings.amqp.url, timeout=ANSWER_S)
    layout = plan(options.rows, options.days, datetime.timedelta(hours=options.generation_hours))
    wrong: list[str] = []
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        await sandbox.create(admin, channel)
        await admin.execute(
            "CREATE INDEX effects_key ON effects (consumer, tenant, message_id)", timeout=ANSWER_S
        )
        say(f"steady: server {await server_settings(admin)}")
        say(
            f"steady: prefill {layout.rows:,} rows = {layout.ended} ended generations and the"
            f" current one half full, {options.generation_hours:g} h each: {layout.rate:,.1f}"
            f" msg/s for {layout.spans * layout.span.total_seconds() / 86400:.2f} days"
        )
        variants = catalog(options.variants)
        bench_options = BenchOptions(
            messages=options.messages,
            slow_messages=options.messages,
            repeats=options.repeats,
            variants=options.variants,
            log_file=options.log_file,
        )
        with Stopwatch().installed() as watch:
            meter = ServerMeter(admin, postmaster, watch)
            rounds = Rounds(
                options=bench_options,
                settings=worker_settings,
                sandbox=sandbox,
                admin=admin,
                channel=channel,
                watch=watch,
                started=started,
            )
            rounds.probe = meter.probe
            empty = await _phase(rounds, meter, admin, sandbox, variants, "empty")
            await admin.execute(
                f"TRUNCATE {quote_ident(sandbox.schema)}.processed_messages", timeout=ANSWER_S
            )
            seconds = await fill(
                url, schema=sandbox.schema, consumer=sandbox.queue, layout=layout, progress=say
            )
            say(f"steady: prefilled {layout.rows:,} rows in {seconds:.0f} s")
            full = await _phase(rounds, meter, admin, sandbox, variants, "prefilled")
        wrong += [w for p in (empty, full) for r in p.results.values() for w in r.wrong]
        say("")
        for line in report([empty, full], options.variants):
            say(line)
    finally:
        try:
            # Drops what the prefill made too.
            await sandbox.drop(admin, await within(ANSWER_S, "a channel", connection.channel()))
        finally:
            await connection.close()
            await admin.close()
    for line in wrong:
        say(f"steady: WRONG {line}")
    say(f"steady: done in {since(started)}")
    return 1 if wrong else 0


def _room(path: Path, rows: int) -> None:
    free = shutil.disk_usage(path).free
    need = rows * BYTES_PER_ROW * 1.5  # and room for the WAL between checkpoints
    say(
        f"steady: {free / 2**30:.0f} GiB free at {path}, the prefill needs about {need / 2**30:.1f}"
    )
    if need > free:
        raise SystemExit(f"steady: not enough disk for --rows {rows:,}")


async def main_async(options: Options, settings: Settings) -> int:
    if options.database_url is not None:
        _room(Path("/"), options.rows)
        say("steady: on --database-url's server: its WAL and CPU count everyone's work")
        url = options.database_url
        return await steady(options, settings, url, await postmaster(url))
    workdir = Path(tempfile.mkdtemp(prefix="iw-steady-"))
    os.chmod(workdir, 0o755)  # the private PostgreSQL runs as the postgres user
    _room(workdir, options.rows)
    postgres = PrivatePostgres(
        workdir / "postgres", free_port(), settings={"shared_buffers": options.shared_buffers}
    )
    try:
        postgres.init()
        await postgres.start()
        assert postgres.proc is not None
        return await steady(options, settings, postgres.url, postgres.proc.pid)
    finally:
        await postgres.stop()
        postgres.kill_now()
        remove_tree(workdir)


def parse(argv: Sequence[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.steady", description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000, help="claims to prefill")
    parser.add_argument("--days", type=float, default=7.0, help="the retention they span")
    parser.add_argument("--generation-hours", type=float, default=24.0)
    parser.add_argument("--messages", type=int, default=20_000, help="per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant and phase")
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated bench variants"
    )
    parser.add_argument("--database-url", default=None, help="this server instead of a private one")
    parser.add_argument("--shared-buffers", default="1GB", help="the private server's")
    parser.add_argument("--log-file", default=DEFAULT_LOG_FILE)
    args = parser.parse_args(list(argv))
    return Options(
        rows=args.rows,
        days=args.days,
        generation_hours=args.generation_hours,
        messages=args.messages,
        repeats=args.repeats,
        variants=tuple(v.strip() for v in args.variants.split(",") if v.strip()),
        database_url=args.database_url,
        shared_buffers=args.shared_buffers,
        log_file=args.log_file,
    )


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    collect_less()
    with open(options.log_file, "wb") as log_file:
        configure_logging("info", json=True, file=log_file)
        code = asyncio.run(main_async(options, Settings.from_env()))
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
