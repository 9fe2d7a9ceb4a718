"""The pg-failover profile: a Patroni cluster whose primary dies under load.

    start a private RabbitMQ and a Patroni cluster (proving.chaos.patroni):
      3 PostgreSQL nodes, `synchronous_mode: true` (the control: asynchronous,
      `synchronous_commit = local`)
    start the workers and the outbox relays on the cluster's multi-host DSN
      (target_session_attrs=read-write); a quarter of the local jobs emit a
      follow-up (`ctx.emit`) that the relays publish and the workers apply;
      `serve` too, and push jobs sent to it (proving.chaos.pg_ingress)
    once the workers have committed a first effect, the faults begin
    publish the workload while, in turn, spread over the load:
      a primary kill: the leader's WAL senders paused 2 s (so the replicas
        lag), SIGKILL of the leader's Patroni, postmaster and paused senders,
        a new leader awaited, the old node started again (it rejoins as a replica)
      a switchover: `patronictl switchover --force`
      a standby stop: a fast shutdown of the sync standby's PostgreSQL
        (Patroni starts it again)
    drain, stop the workers and relays, then count on the final primary:
      lost, doubled (effects and follow-ups per planned key), stuck (queue
      depths and outbox rows never published), and acked_but_missing: keys
      a worker logged as acked (`effect_committed`, `duplicate_ignored`, with
      their message ids) whose effect is absent, and jobs `serve` answered
      202 whose message row is absent (a job it accepted that never reached
      its queue is lost)

`failovers` counts leader changes. Each one's pause (proving.chaos.pg_figures)
is the longest gap between commits around it, twice: on the final
primary's effect rows (`applied_at`) and in the workers' own commit lines,
which is the failover as the workers saw it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, field

import aio_pika
import asyncpg

from consumers import AmqpSettings
from consumers.broker.topology import declare
from dedupe import migrate
from proving.chaos.app import EFFECTS_TABLE, app, follows_up
from proving.chaos.checker import count_stuck, count_unpublished, effect_counts, followup_counts
from proving.chaos.deadletters import DeadLetterWatcher
from proving.chaos.fleet import RELAY_COMMAND, Fleet
from proving.chaos.patroni import PatroniCluster, new_workdir
from proving.chaos.pg_figures import acked_keys, commit_stamps, largest_gaps
from proving.chaos.pg_ingress import (
    INGRESS_QUEUE,
    IngressLoad,
    api_key,
    missing_rows,
    published_ids,
    send_all,
    serve_command,
    serve_url,
)
from proving.chaos.pg_schedule import PgFaults, PgProfile, run_schedule
from proving.chaos.run import _drain, _Probe, say
from proving.chaos.services import PrivateRabbit, ServiceError, free_port, remove_tree
from proving.chaos.workload import JobKind, ResilientPublisher, plan
from proving.deadlines import ANSWER_S, within

FIRST_EFFECT_S = 120.0  # for the workers to start and commit


@dataclass(frozen=True, slots=True, kw_only=True)
class PgOutcome:
    nodes: int
    control: bool
    faults: PgFaults
    messages: int
    unique_local: int
    followups: int  # planned follow-ups (through the outbox and the relays)
    ingress: IngressLoad  # what was sent to `serve` and what it answered 202
    lost: int
    doubled: int
    stuck: int
    acked: int
    acked_but_missing: int
    pauses_s: list[float] = field(default_factory=list)
    commit_gaps_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.doubled or self.stuck or self.acked_but_missing)


async def _prepare(cluster: PatroniCluster, rabbit: PrivateRabbit) -> str:
    """The schema, the queues (chaos.ingress too) and an API key for `serve`; the key."""
    conn = await asyncpg.connect(cluster.dsn, timeout=10)
    try:
        await migrate(conn, "public")
        await conn.execute(EFFECTS_TABLE, timeout=ANSWER_S)
        key = await api_key(conn, "public")
    finally:
        await conn.close()
    connection = await aio_pika.connect(rabbit.url, timeout=10)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        for spec in app.specs.values():
            await declare(channel, spec.queue, spec.retry, AmqpSettings(urls=(rabbit.url,)))
        await channel.declare_queue(
            INGRESS_QUEUE, durable=True, arguments={"x-queue-type": "quorum"}, timeout=ANSWER_S
        )
    finally:
        await connection.close()
    return key


async def _first_effect(probe: _Probe, patience: float) -> None:
    """Until a worker has committed an effect: a fault before that finds nobody to fail."""
    ends = time.monotonic() + patience
    while not await probe.distinct_effects():
        if time.monotonic() > ends:
            raise ServiceError(f"no effect committed within {patience:.0f} s of the start")
        await asyncio.sleep(0.2)


async def _effect_stamps(conn: asyncpg.Connection) -> list[float]:
    """When each effect on the final primary was applied (its transaction's start), sorted."""
    rows = await conn.fetch(
        "SELECT extract(epoch FROM applied_at)::float8 FROM chaos_effects ORDER BY 1",
        timeout=ANSWER_S,
    )
    return [row[0] for row in rows]


async def run_pg_failover(
    profile: PgProfile, *, seed: int, control: bool = False, keep: bool = False
) -> PgOutcome:
    started = time.monotonic()
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    workdir = new_workdir()
    (workdir / "logs").mkdir()
    cluster = PatroniCluster(workdir / "pg", size=profile.nodes, synchronous=not control)
    (workdir / "pg").mkdir()
    (workdir / "pg").chmod(0o755)
    rabbit = PrivateRabbit(workdir / "rabbit", free_port(), free_port())
    env = {
        "AMQP_URL": rabbit.url,
        "DATABASE_URL": cluster.dsn,
        "DATABASE_SCHEMA": "public",
        "IW_SHUTDOWN_GRACE": "10",
    }
    fleet = Fleet(
        size=profile.workers,
        env={**env, "IW_PREFETCH": "200", "IW_MAX_BATCH": "100"},
        log_dir=workdir / "logs",
        crash_quota={},
        max_crash_after=0,
        rng=rng,
    )
    relays = Fleet(
        size=profile.relays,
        env={**env, "IW_RELAY_BATCH": "100"},
        log_dir=workdir / "logs",
        crash_quota={},
        max_crash_after=0,
        rng=rng,
        command=RELAY_COMMAND,
        name="relay",
    )
    serve = Fleet(
        size=1,
        env=env,
        log_dir=workdir / "logs",
        crash_quota={},
        max_crash_after=0,
        rng=rng,
        command=serve_command(free_port()),
        name="serve",
    )
    jobs = plan(messages=profile.messages, poison=0, malformed=0, rng=rng)
    local = {(j.tenant, j.message_id) for j in jobs if j.kind is JobKind.LOCAL}
    followed = {k for k in local if follows_up(k[1])}
    watcher = DeadLetterWatcher(rabbit.url, list(app.specs))
    publisher = ResilientPublisher([rabbit.url])
    probe = _Probe(cluster.dsn)
    faults = PgFaults()
    ok = False
    try:
        say(f"profile={profile.name} control={'async' if control else 'none'} workdir={workdir}")
        await asyncio.gather(cluster.start_all(), rabbit.start())
        say(f"patroni cluster of {profile.nodes} nodes up: {cluster.dsn}")
        key = await _prepare(cluster, rabbit)
        fleet.start()
        relays.start()
        serve.start()
        watcher.start()
        url = await serve_url(workdir / "logs" / "serve-0.log")

        async def faults_once_effects_begin() -> None:
            await _first_effect(probe, patience=FIRST_EFFECT_S)
            await run_schedule(cluster, profile, faults, time.monotonic())

        _, ingress, _ = await asyncio.gather(
            publisher.publish_all(jobs, seconds=profile.load_seconds),
            send_all(
                url,
                key,
                requests=profile.ingress_requests,
                seconds=profile.load_seconds,
                seed=seed,
            ),
            faults_once_effects_begin(),
        )
        say(f"load and faults done at t={time.monotonic() - started:.0f}s; draining")
        await _drain(
            probe,
            watcher,
            rabbit.url,
            app,
            unique_local=len(local),
            expected_dead=0,
            devices=0,
            seconds=profile.drain_seconds,
            expected_followups=len(followed),
        )
        await fleet.stop()
        await relays.stop()
        await serve.stop()
        await watcher.stop()
        jobs_published = await published_ids(rabbit.url)
        connection = await aio_pika.connect(rabbit.url, timeout=ANSWER_S)
        try:
            stuck = await count_stuck(
                await within(ANSWER_S, "a channel", connection.channel()), app
            )
        finally:
            await connection.close()
        conn = await asyncpg.connect(cluster.dsn, timeout=10)
        try:
            effects = await effect_counts(conn)
            followups = await followup_counts(conn)
            unpublished = await count_unpublished(conn)
            pauses = largest_gaps(await _effect_stamps(conn), faults.windows)
            ingress_missing = await missing_rows(conn, ingress.accepted)
        finally:
            await conn.close()
        acked = acked_keys(workdir / "logs") & local
        outcome = PgOutcome(
            nodes=profile.nodes,
            control=control,
            faults=faults,
            messages=len(jobs),
            unique_local=len(local),
            followups=len(followed),
            ingress=ingress,
            lost=sum(1 for k in local if effects.get(k, 0) == 0)
            + sum(1 for k in followed if followups.get(k, 0) == 0)
            + len(ingress.accepted - jobs_published),
            doubled=sum(1 for k in local if effects.get(k, 0) > 1)
            + sum(1 for k in followed if followups.get(k, 0) > 1),
            stuck=stuck + unpublished,
            acked=len(acked),
            acked_but_missing=sum(1 for k in acked if effects.get(k, 0) == 0) + ingress_missing,
            pauses_s=pauses,
            commit_gaps_s=largest_gaps(commit_stamps(workdir / "logs"), faults.windows),
            elapsed_s=time.monotonic() - started,
        )
        ok = outcome.ok
        return outcome
    finally:
        fleet.kill_now()
        relays.kill_now()
        serve.kill_now()
        await probe.close()
        await watcher.stop()
        await publisher.close()
        cluster.kill_now()
        rabbit.kill_now()
        if ok and not keep:
            remove_tree(workdir)
        else:
            say(f"logs kept in {workdir}")


def pg_failover_line(o: PgOutcome) -> str:
    f = o.faults
    return (
        f"pg_failover: nodes={o.nodes} primary_kills={f.primary_kills}"
        f" switchovers={f.switchovers} standby_stops={f.standby_stops} messages={o.messages}"
        f" lost={o.lost} doubled={o.doubled} stuck={o.stuck}"
        f" acked_but_missing={o.acked_but_missing} failovers={f.failovers}"
    )
