"""The cluster profile: quorum queues on 3 nodes, their leader killed under load.

    start a 3-node RabbitMQ cluster (proving.chaos.cluster) and a private PostgreSQL
    declare the chaos queues: quorum queues, replicated on the 3 nodes
    start the workers, each given the 3 addresses in another order, so the
      fleet is spread over the nodes
    publish the workload while, one step after the other:
      SIGKILL the node leading `chaos.local` (asked of rabbitmqctl), start it
        again, wait until every queue has its 3 members online; `leader_kills`
        times, so each kill finds the leader where the last election put it
      a rolling restart: each node stopped cleanly and started, in turn
    let the workers drain, stop them, count as the single-node run does:
      from the effect table, the dead-letter queues and the queue depths

`failovers` counts the worker connections that were open on a node that went
away and moved to the next address (from the workers' `amqp_address_moved`
lines). If the drain stalls with messages unacknowledged on live consumers
(the quorum queue leader-change behaviour RabbitMQ has open reports about),
the queues' state is recorded and printed, and the run fails as stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import asyncpg

from consumers import AmqpSettings, dead_letter_queue, tier_queue
from proving.chaos.app import LOCAL_QUEUE, POISON_RETRY, app
from proving.chaos.checker import Findings, check, count_stuck, effect_counts
from proving.chaos.cluster import ONLINE_PATIENCE_S, LocalCluster
from proving.chaos.deadletters import DeadLetterWatcher
from proving.chaos.fleet import Fleet
from proving.chaos.latency import first_effects, poison_limit, slowest_delivery
from proving.chaos.profile import ClusterProfile
from proving.chaos.run import COUNT_DEADLINE_S, _drain, _prepare, _Probe, say
from proving.chaos.services import RECOVERY_S, PrivatePostgres, free_port, remove_tree
from proving.chaos.workload import JobKind, ResilientPublisher, plan
from proving.deadlines import deadline, within


@dataclass(slots=True, kw_only=True)
class NodeFaults:
    leader_kills: int = 0
    rolling_restarts: int = 0  # complete rounds
    node_restarts: int = 0  # every start after a stop or a kill
    leaders_seen: list[str] = field(default_factory=list)  # the node killed, each time
    downtime_s: float = 0.0  # from a kill or stop to every queue online on all nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterOutcome:
    findings: Findings
    faults: NodeFaults
    nodes: int
    failovers: int
    stalls: list[str]  # queue states seen when the drain did not settle
    published: int
    republished: int
    elapsed_s: float


def _queues() -> list[str]:
    names: list[str] = []
    for spec in app.specs.values():
        names += [spec.queue, dead_letter_queue(spec.queue)]
        names += [tier_queue(spec.queue, t) for t in spec.retry.tiers_seconds]
    return names


async def _node_faults(
    cluster: LocalCluster, profile: ClusterProfile, faults: NodeFaults, started: float
) -> None:
    """The kills, then the rolling restarts, spread over the load phase."""
    queues = _queues()
    steps = profile.leader_kills + profile.rolling_restarts * len(cluster.nodes)
    slot = 0.85 * profile.load_seconds / max(steps, 1)
    for n in range(profile.leader_kills):
        if (wait := started + 0.05 * profile.load_seconds + n * slot - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        leader = None
        async with deadline(
            ONLINE_PATIENCE_S, f"a leader for {LOCAL_QUEUE} to kill", state=[cluster]
        ):
            while leader is None:
                leader = await cluster.leader(LOCAL_QUEUE)
                if leader is None:
                    await asyncio.sleep(0.5)
        began = time.monotonic()
        await leader.stop(crash=True)
        faults.leader_kills += 1
        faults.leaders_seen.append(leader.node)
        say(f"leader kill {n + 1}/{profile.leader_kills}: {leader.node} (SIGKILL)")
        await leader.start()
        faults.node_restarts += 1
        await cluster.wait_online(queues)
        faults.downtime_s += time.monotonic() - began
    for _ in range(profile.rolling_restarts):
        for node in cluster.nodes:
            began = time.monotonic()
            await node.stop()
            say(f"rolling restart: {node.node} stopped")
            await node.start()
            faults.node_restarts += 1
            await cluster.wait_online(queues)
            faults.downtime_s += time.monotonic() - began
        faults.rolling_restarts += 1


def count_failovers(log_dir: Path) -> int:
    """Worker connections that were open when their node went and moved on."""
    moved = 0
    for path in log_dir.glob("worker-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if '"amqp_address_moved"' in line:
                with contextlib.suppress(ValueError):
                    moved += bool(json.loads(line).get("was_open"))
    return moved


async def run_cluster_chaos(
    profile: ClusterProfile, *, seed: int, keep: bool = False
) -> ClusterOutcome:
    started = time.monotonic()
    wall_offset = time.time() - started  # monotonic + this: the database's clock
    for name in ("aio_pika", "aiormq"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="iw-chaos-cluster-"))
    os.chmod(workdir, 0o755)  # the private PostgreSQL runs as the postgres user
    (workdir / "logs").mkdir()
    postgres = PrivatePostgres(workdir / "postgres", free_port())
    cluster = LocalCluster(workdir / "rabbitmq", size=profile.nodes)
    urls = cluster.urls
    fleet = Fleet(
        size=profile.workers,
        env={
            "DATABASE_URL": postgres.url,
            "DATABASE_SCHEMA": "public",
            "IW_PREFETCH": "200",
            "IW_MAX_BATCH": "100",
            "IW_SHUTDOWN_GRACE": "10",
        },
        # Worker i tries node i first: the fleet is spread over the nodes.
        slot_env=[
            {"AMQP_URL": ",".join(urls[i % len(urls) :] + urls[: i % len(urls)])}
            for i in range(profile.workers)
        ],
        log_dir=workdir / "logs",
        crash_quota={},
        max_crash_after=0,
        rng=rng,
    )
    jobs = plan(
        messages=profile.messages, poison=profile.poison, malformed=profile.malformed, rng=rng
    )
    unique_local = sum(1 for j in jobs if j.kind is JobKind.LOCAL)
    watcher = DeadLetterWatcher(urls, list(app.specs))
    publisher = ResilientPublisher(urls)
    probe = _Probe(postgres.url)
    faults = NodeFaults()
    stalls: list[str] = []
    ok = False
    try:
        say(f"profile={profile.name} seed={seed} workdir={workdir}")
        postgres.init()
        began = time.monotonic()
        await asyncio.gather(cluster.start(), postgres.start())
        say(
            f"cluster of {len(cluster.nodes)} nodes formed in {time.monotonic() - began:.0f} s:"
            f" {', '.join(f'{n.node} :{n.port}' for n in cluster.nodes)};"
            f" postgresql :{postgres.port}"
        )
        # The workers' default limit: this fleet does not set IW_DELIVERY_LIMIT.
        await _prepare(postgres, cluster.nodes[0], app, AmqpSettings().delivery_limit)
        await cluster.wait_online(_queues())
        fleet.start()
        watcher.start()
        say(
            f"{len(jobs)} publishes ({unique_local} distinct local jobs) over"
            f" {profile.load_seconds:.0f} s; {profile.leader_kills} leader kills,"
            f" {profile.rolling_restarts} rolling restart(s); {profile.workers} workers"
        )
        load_started = time.monotonic()
        # The node faults are spread over the load phase; the last may still be
        # waiting for its node to be back and every queue online when it ends.
        async with deadline(
            profile.load_seconds + RECOVERY_S + ONLINE_PATIENCE_S,
            "the load phase (every publish confirmed, every node fault over)",
            state=[cluster, postgres],
        ):
            await asyncio.gather(
                publisher.publish_all(jobs, seconds=profile.load_seconds),
                _node_faults(cluster, profile, faults, load_started),
            )
        say(f"load and node faults done at t={time.monotonic() - started:.0f}s; draining")
        await _drain(
            probe,
            watcher,
            cluster.nodes[0].url,
            app,
            unique_local=unique_local,
            expected_dead=profile.poison + profile.malformed,
            devices=0,
            seconds=profile.drain_seconds,
        )
        done = await probe.distinct_effects()
        if done is None or done < unique_local:
            state = await cluster.queues(list(app.specs))
            detail = await cluster.ctl(
                "list_queues", "name", "messages_ready", "messages_unacknowledged", "consumers"
            )
            stalls.append(f"effects={done}/{unique_local}; {state}; {detail.strip()}")
        await fleet.stop()
        await watcher.stop()
        async with deadline(
            COUNT_DEADLINE_S,
            f"counting after the run (logs in {workdir})",
            state=[cluster, postgres],
        ):
            await watcher.drain()
            url = cluster.nodes[0].url
            connection = await aio_pika.connect(url, timeout=10)
            try:
                channel = await within(10, f"a channel on {url}", connection.channel())
                stuck = await count_stuck(channel, app)
            finally:
                await connection.close()
            conn = await asyncpg.connect(postgres.url, timeout=10)
            try:
                effects = await effect_counts(conn)
                applied = await first_effects(conn)
            finally:
                await conn.close()
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
        )
        ok = findings.ok and not stalls
        return ClusterOutcome(
            findings=findings,
            faults=faults,
            nodes=len(cluster.nodes),
            failovers=count_failovers(workdir / "logs"),
            stalls=stalls,
            published=publisher.published,
            republished=publisher.republished,
            elapsed_s=time.monotonic() - started,
        )
    finally:
        fleet.kill_now()
        await probe.close()
        await watcher.stop()
        await publisher.close()
        cluster.kill_now()
        await postgres.stop()
        postgres.kill_now()
        if ok and not keep:
            remove_tree(workdir)
        else:
            say(f"logs kept in {workdir}")


def cluster_line(outcome: ClusterOutcome) -> str:
    f = outcome.findings
    return (
        f"cluster: nodes={outcome.nodes} leader_kills={outcome.faults.leader_kills}"
        f" rolling_restarts={outcome.faults.rolling_restarts} messages={f.messages}"
        f" lost={f.lost} doubled={f.doubled} stuck={f.stuck} failovers={outcome.failovers}"
    )
