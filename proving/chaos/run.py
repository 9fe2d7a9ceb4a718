"""One chaos run: private services, proxies, workers, load, faults, then a count.

    start a private RabbitMQ node and PostgreSQL cluster (never the shared ones)
    put a fault proxy in front of each; workers and outbox relays connect only
    through those
    publish the workload over the load phase while the injector fires faults
    stop the faults, let the workers drain, stop them
    count from the effect table, the dead-letter queues and the queue depths

Everything started here is torn down in `finally`, and every child process
dies with the run even if the run itself is SIGKILLed (a parent-death signal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import asyncpg
import structlog

from consumers import AmqpSettings, App, CrashPoint
from consumers.broker.topology import declare
from dedupe import migrate
from proving.chaos.app import (
    EFFECTS_TABLE,
    HANG_DIR_ENV,
    POISON_QUEUE,
    POISON_RETRY,
    PUSH_QUEUE,
    app,
    follows_up,
    push_app,
)
from proving.chaos.checker import (
    Findings,
    check,
    count_stuck,
    count_unpublished,
    effect_counts,
    followup_counts,
    observed_timeouts,
)
from proving.chaos.deadletters import DeadLetterWatcher
from proving.chaos.faults import FaultKind, FaultLog, Injector, timeline
from proving.chaos.fleet import RELAY_COMMAND, Fleet, FleetCounts
from proving.chaos.latency import first_effects, poison_limit, slowest_delivery
from proving.chaos.profile import Profile
from proving.chaos.proxy import FaultProxy
from proving.chaos.pushes import (
    FakeProviders,
    PushFindings,
    check_pushes,
    ledger_status,
    plan_pushes,
)
from proving.chaos.services import (
    RECOVERY_S,
    PrivatePostgres,
    PrivateRabbit,
    free_port,
    remove_tree,
)
from proving.chaos.workload import JobKind, ResilientPublisher, plan
from proving.deadlines import deadline

log = structlog.get_logger(__name__)

# How long counting after the run may take: a few seconds when the services answer.
COUNT_DEADLINE_S = 120.0
# Migrating and declaring on fresh private services: seconds when they answer.
PREPARE_DEADLINE_S = 60.0
# The workers' default handler deadline and watchdog grace (chaos.slow's is shorter).
HANDLER_TIMEOUT_S = 10.0
WATCHDOG_GRACE_S = 4.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    findings: Findings
    faults: FaultLog
    fleet: FleetCounts
    push: PushFindings | None
    published: int
    republished: int
    elapsed_s: float
    workdir: Path


def say(text: str) -> None:
    print(f"chaos: {text}", flush=True)


async def _prepare(
    postgres: PrivatePostgres, rabbit: PrivateRabbit, target: App, delivery_limit: int
) -> None:
    async with deadline(
        PREPARE_DEADLINE_S,
        "migrating the private database, declaring the queues",
        state=[rabbit, postgres],
    ):
        conn = await asyncpg.connect(postgres.url, timeout=10)
        try:
            await migrate(conn, "public")
            await conn.execute(EFFECTS_TABLE)
        finally:
            await conn.close()
        connection = await aio_pika.connect(rabbit.url, timeout=10)
        try:
            channel = await connection.channel()
            for spec in target.specs.values():
                amqp = AmqpSettings(urls=(rabbit.url,), delivery_limit=delivery_limit)
                await declare(channel, spec.queue, spec.retry, amqp)
        finally:
            await connection.close()


class _Probe:
    """Reconnecting counts of effects and settled pushes, for progress and the drain."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: asyncpg.Connection | None = None

    async def _count(self, sql: str, *args: object) -> int | None:
        """`sql`'s count, or None while the database cannot be reached."""
        try:
            if self.conn is None or self.conn.is_closed():
                self.conn = await asyncpg.connect(self.url, timeout=5)
            value: int = await self.conn.fetchval(sql, *args, timeout=10)
            return value
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            self.conn = None
            return None

    async def distinct_followups(self) -> int | None:
        return await self._count("SELECT count(DISTINCT (tenant, message_id)) FROM chaos_followups")

    async def unpublished(self) -> int | None:
        return await self._count("SELECT count(*) FROM outbox WHERE published_at IS NULL")

    async def distinct_effects(self) -> int | None:
        return await self._count("SELECT count(DISTINCT (tenant, message_id)) FROM chaos_effects")

    async def unsettled_pushes(self, devices: int) -> int | None:
        """Devices whose ledger row is missing or not yet `sent` or `failed`."""
        settled = await self._count(
            "SELECT count(*) FROM send_ledger WHERE consumer = $1 AND status IN ('sent', 'failed')",
            PUSH_QUEUE,
        )
        return None if settled is None else devices - settled

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()


async def run_chaos(profile: Profile, *, seed: int, keep: bool = False) -> Outcome:
    started = time.monotonic()
    wall_offset = time.time() - started  # monotonic + this: wall clock, as in the logs
    # Our own clients reconnect across every restart on purpose: keep their
    # reconnect chatter out of the output.
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="iw-chaos-"))
    os.chmod(workdir, 0o755)  # the private PostgreSQL runs as the postgres user
    rabbit = PrivateRabbit(workdir / "rabbitmq", free_port(), free_port())
    postgres = PrivatePostgres(workdir / "postgres", free_port())
    amqp_proxy = FaultProxy("amqp", free_port(), rabbit.port, seed=seed)
    pg_proxy = FaultProxy("postgresql", free_port(), postgres.port, seed=seed + 1)
    (workdir / "logs").mkdir()
    (workdir / "hangs").mkdir()
    delivery_limit = profile.channel_closes() + 1
    services_env = {
        "AMQP_URL": f"amqp://guest:guest@127.0.0.1:{amqp_proxy.port}/",
        "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{pg_proxy.port}/postgres",
        "DATABASE_SCHEMA": "public",
        "IW_SHUTDOWN_GRACE": "10",
    }
    fleet = Fleet(
        size=profile.workers,
        env={
            **services_env,
            "IW_PREFETCH": "200",
            "IW_MAX_BATCH": "100",
            # Above what the schedule's faults can hand a delivery back: the
            # default 20 dead-lettered valid jobs that sat in a backlog through
            # 20 of its worker's deaths when a busy machine slowed the drain.
            "IW_DELIVERY_LIMIT": str(delivery_limit),
            # A hang (chaos.slow) blocks a worker for the watchdog's limit, the
            # longest deadline plus the grace: 14 s here, not the default 40.
            "IW_HANDLER_TIMEOUT": str(HANDLER_TIMEOUT_S),
            "IW_WATCHDOG_GRACE": str(WATCHDOG_GRACE_S),
            HANG_DIR_ENV: str(workdir / "hangs"),
        },
        log_dir=workdir / "logs",
        crash_quota={
            CrashPoint.BEFORE_COMMIT: profile.faults.get(FaultKind.CRASH_BEFORE_COMMIT, 0),
            CrashPoint.AFTER_COMMIT: profile.faults.get(FaultKind.CRASH_AFTER_COMMIT, 0),
            CrashPoint.AFTER_SEND: profile.faults.get(FaultKind.CRASH_AFTER_SEND, 0),
        },
        max_crash_after=profile.max_crash_after,
        rng=rng,
        push=profile.push_jobs > 0,
        spread_seconds=profile.load_seconds * 0.9,
        hang_dir=workdir / "hangs",
    )
    # The local jobs' follow-ups go out through the outbox, published by
    # relay processes of their own; some relay starts are armed to kill
    # themselves between a confirmed publish and its mark.
    relays = Fleet(
        size=profile.relays,
        env={**services_env, "IW_RELAY_BATCH": "100"},
        log_dir=workdir / "logs",
        crash_quota={
            CrashPoint.AFTER_PUBLISH: profile.faults.get(FaultKind.CRASH_AFTER_PUBLISH, 0)
        },
        max_crash_after=profile.max_crash_after,
        rng=rng,
        spread_seconds=profile.load_seconds * 0.9,
        command=RELAY_COMMAND,
        name="relay",
    )
    target = push_app if profile.push_jobs else app
    jobs = plan(
        messages=profile.messages,
        poison=profile.poison,
        malformed=profile.malformed,
        rng=rng,
        decode=profile.decode_poison,
        timeouts=profile.handler_timeouts,
        hangs=profile.hangs,
    )
    push_jobs, devices = plan_pushes(profile.push_jobs, rng)
    jobs += push_jobs
    rng.shuffle(jobs)
    fakes = FakeProviders(devices, workdir) if devices else None
    unique_local = sum(1 for j in jobs if j.kind is JobKind.LOCAL)
    expected_dead = profile.poison + profile.malformed + profile.decode_poison
    watcher = DeadLetterWatcher(rabbit.url, list(target.specs))
    publisher = ResilientPublisher(rabbit.url)
    probe = _Probe(postgres.url)
    injector = Injector(
        fleet=fleet,
        rabbit=rabbit,
        postgres=postgres,
        amqp_proxy=amqp_proxy,
        pg_proxy=pg_proxy,
        rng=rng,
        journal=workdir / "faults.log",
        drop_http2=fakes.drop_connections if fakes else None,
        relays=relays,
    )
    ok = False
    stack = contextlib.AsyncExitStack()
    try:
        say(f"profile={profile.name} seed={seed} workdir={workdir}")
        postgres.init()
        await asyncio.gather(rabbit.start(), postgres.start())
        await _prepare(postgres, rabbit, target, delivery_limit)
        if fakes is not None:
            await stack.enter_async_context(fakes)
            fleet.env.update(fakes.worker_env())
        await amqp_proxy.start()
        await pg_proxy.start()
        say(
            f"private rabbitmq :{rabbit.port} ({rabbit.node}), postgresql :{postgres.port};"
            f" proxies :{amqp_proxy.port}, :{pg_proxy.port}"
        )
        fleet.start()
        relays.start()
        watcher.start()
        events = timeline(profile.faults, profile.load_seconds, rng)
        say(
            f"{len(jobs)} publishes ({unique_local} distinct local jobs, {profile.poison} poison,"
            f" {profile.malformed} malformed, {profile.decode_poison} decode poison,"
            f" {profile.handler_timeouts} handler timeouts, {profile.hangs} hangs,"
            f" {len(push_jobs)} push jobs to {len(devices)}"
            f" devices) over {profile.load_seconds:.0f} s;"
            f" {len(events)} scheduled faults, {profile.workers} workers,"
            f" {profile.relays} outbox relays"
        )

        async def progress() -> None:
            while True:
                await asyncio.sleep(15)
                done = await probe.distinct_effects()
                say(
                    f"t={time.monotonic() - started:.0f}s published={publisher.published}"
                    f" effects={done} followups={await probe.distinct_followups()}"
                    f" dead_letters={len(watcher.seen)}"
                    f" faults={sum(injector.log.injected.values())}"
                    f" crashes={dict(fleet.counts.crashed_at)} hangs={fleet.counts.hangs}"
                    f" workers={len(fleet.alive())}"
                )

        reporter = asyncio.create_task(progress())
        try:
            # The faults are spread over the load phase; the last one may still
            # be bringing a service back (a stop, then a start) when it ends.
            async with deadline(
                profile.load_seconds + RECOVERY_S,
                "the load phase (every publish confirmed, every fault over)",
                state=[rabbit, postgres],
            ):
                await asyncio.gather(
                    publisher.publish_all(jobs, seconds=profile.load_seconds),
                    injector.run(events),
                )
            say(f"load and faults done at t={time.monotonic() - started:.0f}s; draining")
            pg_proxy.disarm()
            await fleet.disarm()
            await relays.disarm()
            await _drain(
                probe,
                watcher,
                rabbit.url,
                target,
                unique_local=unique_local,
                expected_dead=expected_dead,
                expected_followups=sum(
                    1 for j in jobs if j.kind is JobKind.LOCAL and follows_up(j.message_id)
                ),
                devices=len(devices),
                seconds=profile.drain_seconds,
            )
        finally:
            reporter.cancel()
        injector.record_cuts()
        injector.record_crashes()
        await fleet.stop()
        await relays.stop()
        await watcher.stop()
        # Counting has a deadline: a broker or database that stopped answering
        # fails the run here, saying so, instead of hanging until a caller's timeout.
        async with deadline(
            COUNT_DEADLINE_S,
            f"counting after the run (logs in {workdir})",
            state=[rabbit, postgres],
        ):
            await watcher.drain()
            connection = await aio_pika.connect(rabbit.url, timeout=10)
            try:
                stuck = await count_stuck(await connection.channel(), target)
            finally:
                await connection.close()
            conn = await asyncpg.connect(postgres.url, timeout=10)
            try:
                effects = await effect_counts(conn)
                applied = await first_effects(conn)
                followups = await followup_counts(conn)
                stuck += await count_unpublished(conn)
                status = await ledger_status(conn)
            finally:
                await conn.close()
        push = check_pushes(devices, fakes.requests(), status) if fakes else None
        if push is not None:
            injector.record_scripts(push.scripts_served)
        findings = check(
            jobs=jobs,
            effects=effects,
            dead=watcher.seen,
            dead_copies=watcher.copies,
            first_sent=publisher.first_sent,
            poison_limit_s=poison_limit(
                POISON_RETRY,
                slowest_delivery(jobs, publisher.first_sent, applied, wall_offset),
            ),
            stuck=stuck,
            followups=followups,
            timeouts=observed_timeouts(workdir / "logs"),
            hangs=fleet.counts.hangs,
            unexpected_stuck=fleet.counts.unexpected_stuck,
        )
        ok = findings.ok and (push is None or push.ok)
        _write_poison_times(workdir / "poison.tsv", watcher, publisher, wall_offset)
        return Outcome(
            findings=findings,
            push=push,
            faults=injector.log,
            fleet=fleet.counts,
            published=publisher.published,
            republished=publisher.republished,
            elapsed_s=time.monotonic() - started,
            workdir=workdir,
        )
    finally:
        fleet.kill_now()
        relays.kill_now()
        await stack.aclose()
        await probe.close()
        await watcher.stop()
        await publisher.close()
        await amqp_proxy.close()
        await pg_proxy.close()
        await rabbit.stop()
        await postgres.stop()
        rabbit.kill_now()
        postgres.kill_now()
        if ok and not keep:
            remove_tree(workdir)
        else:
            say(f"logs kept in {workdir}")


def _write_poison_times(
    path: Path, watcher: DeadLetterWatcher, publisher: ResilientPublisher, offset: float
) -> None:
    """When each poison job was confirmed, dead-lettered by a worker, seen: for a late one."""
    rows = ["message_id\tconfirmed\tdead_lettered\tseen\tattempt"]
    for (queue, key), letter in sorted(watcher.seen.items()):
        sent = publisher.first_sent.get((queue, key))
        if queue != POISON_QUEUE or sent is None or letter.mark:
            continue
        rows.append(
            f"{key}\t{sent + offset:.3f}\t{letter.stamped_at:.3f}"
            f"\t{letter.seen_at + offset:.3f}\t{letter.attempt}"
        )
    path.write_text("\n".join(rows) + "\n")


async def _drain(
    probe: _Probe,
    watcher: DeadLetterWatcher,
    amqp_url: str,
    target: App,
    *,
    unique_local: int,
    expected_dead: int,
    devices: int,
    seconds: float,
    expected_followups: int | None = None,
) -> None:
    """Wait until every job is accounted for and the queues stay empty, or `seconds` pass."""
    ends = time.monotonic() + seconds
    empty_since: float | None = None
    while time.monotonic() < ends:
        await asyncio.sleep(1.0)
        done = await probe.distinct_effects()
        if done is None or done < unique_local or len(watcher.seen) < expected_dead:
            empty_since = None
            continue
        if devices and await probe.unsettled_pushes(devices) != 0:
            empty_since = None
            continue
        if expected_followups is not None:
            followups = await probe.distinct_followups()
            if followups is None or followups < expected_followups or await probe.unpublished():
                empty_since = None
                continue
        try:
            connection = await aio_pika.connect(amqp_url, timeout=5)
            try:
                channel = await asyncio.wait_for(connection.channel(), 5)  # expiry: poll again
                ready = await count_stuck(channel, target)
            finally:
                await connection.close()
        except Exception:
            continue
        if ready:
            empty_since = None
        elif empty_since is None:
            empty_since = time.monotonic()
        elif time.monotonic() - empty_since >= 3.0:
            return
    say(f"drain timed out after {seconds:.0f} s")
