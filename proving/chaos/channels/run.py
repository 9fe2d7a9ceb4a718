"""One channel's chaos run: workers SIGKILLed mid-call on a schedule, then a count at the receiver.

    start a private RabbitMQ node and PostgreSQL cluster (never the shared ones)
    start the channel's receiver in this process; prepare the database for it
    start the workers (`proving.chaos.channels.app:<channel>`), some starts armed
    to SIGKILL themselves after a provider answered, before the answer is recorded
    publish the jobs over the load phase while random workers are SIGKILLed
    at each death, read the ledger rows the dead worker held (`proving.crash_window`)
    stop the kills, let the workers drain, stop them
    count at the receiver, against the ledger and the deaths (`Channel.count`)

Everything started here is torn down in `finally`; every child process dies
with the run, even if the run itself is SIGKILLed.
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

from consumers import AmqpSettings, App, CrashPoint
from consumers.broker.topology import declare
from dedupe import migrate
from proving.chaos.channels.api import ApiChannel
from proving.chaos.channels.app import APPS
from proving.chaos.channels.channel import Channel, ChannelFindings
from proving.chaos.channels.email import EmailChannel
from proving.chaos.channels.profile import ChannelProfile
from proving.chaos.channels.webhooks import WebhookChannel
from proving.chaos.channels.webpush import WebPushChannel
from proving.chaos.checker import count_stuck
from proving.chaos.fleet import Fleet
from proving.chaos.run import COUNT_DEADLINE_S, PREPARE_DEADLINE_S
from proving.chaos.services import PrivatePostgres, PrivateRabbit, free_port, remove_tree
from proving.chaos.workload import ResilientPublisher
from proving.crash_window import Death, died
from proving.deadlines import ANSWER_S, deadline, within


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelOutcome:
    profile: ChannelProfile
    findings: ChannelFindings
    publishes: int
    sigkills: int
    crashes_after_send: int
    deaths: int  # SIGKILLs the fleet saw, both kinds
    held_at_deaths: int  # ledger rows the dead workers held `sending`
    stuck: int  # messages left in the work queue or a retry tier
    elapsed_s: float
    workdir: Path

    @property
    def ok(self) -> bool:
        return self.findings.ok and self.stuck == 0

    def line(self) -> str:
        return self.findings.line(jobs=self.publishes, kills=self.deaths) + f" stuck={self.stuck}"


def say(text: str) -> None:
    print(f"chaos: {text}", flush=True)


def make_channel(profile: ChannelProfile) -> Channel:
    if profile.channel == "webhooks":
        return WebhookChannel(latency_s=profile.latency_s)
    if profile.channel == "webpush":
        return WebPushChannel(latency_s=profile.latency_s)
    if profile.channel == "email":
        return EmailChannel()
    if profile.channel in ("api", "api_lookup"):
        return ApiChannel(latency_s=profile.latency_s, name=profile.channel.replace("_", "-"))
    raise ValueError(f"no channel {profile.channel!r}")


class _Deaths:
    """What each worker that died by SIGKILL held, read as soon as the fleet saw it die."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.deaths: list[Death] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def killed(self, pid: int) -> None:  # the fleet's supervisor calls this
        task = asyncio.create_task(self._read(pid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, pid: int) -> None:
        conn = await asyncpg.connect(self.url, timeout=ANSWER_S)
        try:
            self.deaths.append(await died(conn, pid))
        finally:
            await conn.close()

    async def settle(self) -> None:
        if self._tasks:
            await asyncio.wait_for(asyncio.gather(*self._tasks), ANSWER_S)


async def _kill_on_schedule(fleet: Fleet, profile: ChannelProfile, rng: random.Random) -> int:
    started = time.monotonic()
    done = 0
    for at in sorted(
        rng.uniform(0.05, 0.9) * profile.load_seconds for _ in range(profile.sigkills)
    ):
        if (wait := started + at - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        done += fleet.sigkill()
    return done


async def run_channel_chaos(
    profile: ChannelProfile, *, seed: int, keep: bool = False
) -> ChannelOutcome:
    started = time.monotonic()
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix=f"iw-chaos-{profile.channel}-"))
    os.chmod(workdir, 0o755)  # the private PostgreSQL runs as the postgres user
    (workdir / "logs").mkdir()
    rabbit = PrivateRabbit(workdir / "rabbitmq", free_port(), free_port())
    postgres = PrivatePostgres(workdir / "postgres", free_port())
    app = APPS[profile.channel]
    channel = make_channel(profile)
    deaths = _Deaths(postgres.url)
    publisher = ResilientPublisher(rabbit.url)
    fleet = Fleet(
        size=profile.workers,
        env={
            "AMQP_URL": rabbit.url,
            "DATABASE_URL": postgres.url,
            "DATABASE_SCHEMA": "public",
            "IW_SHUTDOWN_GRACE": "10",
            "IW_DELIVERY_LIMIT": str(profile.kills + 5),  # a kill hands a delivery back once
        },
        log_dir=workdir / "logs",
        crash_quota={CrashPoint.AFTER_SEND: profile.crashes_after_send},
        max_crash_after=profile.max_crash_after,
        rng=rng,
        spread_seconds=profile.load_seconds * 0.9,
        command=("consumers", "run", f"proving.chaos.channels.app:{profile.channel}"),
        on_killed=deaths.killed,
    )
    ok = False
    try:
        say(f"profile={profile.name} seed={seed} workdir={workdir}")
        postgres.init()
        await asyncio.gather(rabbit.start(), postgres.start())
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(channel)
            async with deadline(
                PREPARE_DEADLINE_S, "preparing the private services", state=[rabbit, postgres]
            ):
                conn = await asyncpg.connect(postgres.url, timeout=10)
                try:
                    await migrate(conn, "public")
                    await channel.prepare(conn)
                finally:
                    await conn.close()
                connection = await aio_pika.connect(rabbit.url, timeout=10)
                try:
                    amqp = AmqpSettings(urls=(rabbit.url,), delivery_limit=profile.kills + 5)
                    ch = await connection.channel()
                    for spec in app.specs.values():
                        await declare(ch, spec.queue, spec.retry, amqp)
                finally:
                    await connection.close()
            jobs = channel.plan(profile.jobs, rng)
            fleet.env.update(channel.worker_env(workdir))
            fleet.start()
            say(
                f"{len(jobs)} {profile.channel} jobs over {profile.load_seconds:.0f} s,"
                f" {profile.workers} workers, {profile.sigkills} SIGKILLs,"
                f" {profile.crashes_after_send} starts armed to die after a send"
            )
            async with deadline(
                profile.load_seconds + ANSWER_S, "the load phase", state=[rabbit, postgres]
            ):
                _, sigkills = await asyncio.gather(
                    publisher.publish_all(jobs, seconds=profile.load_seconds),
                    _kill_on_schedule(fleet, profile, rng),
                )
            say(f"load and kills done at t={time.monotonic() - started:.0f}s; draining")
            await fleet.disarm()
            await _drain(channel, postgres.url, rabbit.url, app, profile.drain_seconds)
            await fleet.stop()
            await deaths.settle()
            async with deadline(
                COUNT_DEADLINE_S, f"counting (logs in {workdir})", state=[rabbit, postgres]
            ):
                connection = await aio_pika.connect(rabbit.url, timeout=10)
                try:
                    stuck = await count_stuck(await connection.channel(), app)
                finally:
                    await connection.close()
                conn = await asyncpg.connect(postgres.url, timeout=10)
                try:
                    findings = await channel.count(conn, deaths.deaths, workdir / "logs")
                finally:
                    await conn.close()
        outcome = ChannelOutcome(
            profile=profile,
            findings=findings,
            publishes=len(jobs),
            sigkills=sigkills,
            crashes_after_send=fleet.counts.crashed_at[str(CrashPoint.AFTER_SEND)],
            deaths=len(deaths.deaths),
            held_at_deaths=sum(len(d.held) for d in deaths.deaths),
            stuck=stuck,
            elapsed_s=time.monotonic() - started,
            workdir=workdir,
        )
        ok = outcome.ok
        return outcome
    finally:
        fleet.kill_now()
        await publisher.close()
        await rabbit.stop()
        await postgres.stop()
        rabbit.kill_now()
        postgres.kill_now()
        if ok and not keep:
            remove_tree(workdir)
        else:
            say(f"logs kept in {workdir}")


async def _drain(channel: Channel, db_url: str, amqp_url: str, app: App, seconds: float) -> None:
    """Until every job is settled and the queues stay empty for 3 s, or `seconds` pass."""
    ends = time.monotonic() + seconds
    empty_since: float | None = None
    while time.monotonic() < ends:
        await asyncio.sleep(1.0)
        try:
            conn = await asyncpg.connect(db_url, timeout=10)
            try:
                done = await channel.done(conn)
            finally:
                await conn.close()
            connection = await aio_pika.connect(amqp_url, timeout=10)
            try:
                ready = await count_stuck(await within(10, "a channel", connection.channel()), app)
            finally:
                await connection.close()
        except (OSError, TimeoutError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError):
            continue  # ask again in a second
        if not done or ready:
            empty_since = None
        elif empty_since is None:
            empty_since = time.monotonic()
        elif time.monotonic() - empty_since >= 3.0:
            return
    say(f"drain timed out after {seconds:.0f} s")
