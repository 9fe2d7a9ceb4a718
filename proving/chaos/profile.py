"""How much load and how many faults: the CI profile and the full one.

Counts are per fault kind. For `sigterm` the count is rolling rounds (every
worker SIGTERMed in turn, so `workers` SIGTERMs a round); the two crash
points are a quota of kills drawn by worker starts, not timeline events
(`crash_after_publish`: by relay starts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proving.chaos.faults import FaultKind

K = FaultKind


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    name: str
    messages: int  # publishes in all, duplicates, poison and malformed included
    poison: int
    malformed: int
    workers: int
    load_seconds: float  # publishing is spread over this, and the faults with it
    faults: Mapping[FaultKind, int]
    max_crash_after: int  # an armed worker crashes after 0..this many batches
    drain_seconds: float = 180.0  # after the load: at most this long to settle
    push_jobs: int = 0  # push publishes on top of `messages` (duplicates included)
    decode_poison: int = 0  # of `messages`: fail outside the handler (proving.chaos.poison)
    relays: int = 2  # outbox relay processes, publishing the local jobs' follow-ups
    # Of the local jobs (proving.chaos.app, chaos.slow): await past their deadline on
    # attempt 1; block the event loop once (each costs a worker its watchdog exit).
    handler_timeouts: int = 0
    hangs: int = 0

    def channel_closes(self) -> int:
        """The most times one delivery can be handed back by a closed channel in a run.

        A delivery is held by one worker at a time, so each fault that closes
        channels returns it at most once: a worker killed (SIGKILL, a crash
        point, a hang's watchdog exit), SIGTERMed (a round stops each worker
        once), or every worker's connection reset, held until it drops, or
        lost with the broker. A quorum queue counts each return toward its
        delivery-limit, whether a handler ever started on the delivery or not
        (docs/concepts.md); the chaos fleet's limit is set above this, so a
        job dead-lettered by the broker is a defect, never the schedule's
        arithmetic.
        """
        per_worker = self.faults.get(K.SIGTERM, 0) * self.workers
        once = (
            K.SIGKILL,
            K.CRASH_BEFORE_COMMIT,
            K.CRASH_AFTER_COMMIT,
            K.CRASH_AFTER_SEND,
            K.RABBITMQ_RESTART,
            K.RABBITMQ_KILL,
            K.AMQP_RESET,
            K.AMQP_HOLD,
        )
        return per_worker + self.hangs + sum(self.faults.get(kind, 0) for kind in once)


CI = Profile(
    name="ci",
    messages=3_000,
    poison=60,
    malformed=30,
    workers=3,
    # 10 restarts over 0.87 x 150 s: a slot of 13 s each, and a restart takes 5 to 12 s
    # (they take turns); the whole run about 3 minutes on 2 cores, under the suite's 4.
    load_seconds=150.0,
    max_crash_after=10,
    push_jobs=600,
    decode_poison=40,
    handler_timeouts=12,
    hangs=3,
    faults={
        K.SIGKILL: 12,
        K.CRASH_BEFORE_COMMIT: 12,
        K.CRASH_AFTER_COMMIT: 12,
        K.SIGTERM: 4,
        K.RABBITMQ_RESTART: 2,
        K.RABBITMQ_KILL: 2,
        K.POSTGRES_RESTART: 6,
        K.AMQP_RESET: 12,
        K.PG_RESET: 12,
        K.AMQP_HOLD: 6,
        K.PG_HOLD: 6,
        K.AMQP_LATENCY: 6,
        K.PG_LATENCY: 6,
        K.COMMIT_CUT: 12,
        K.CRASH_AFTER_SEND: 12,
        K.HTTP2_DROP: 6,
        K.RELAY_KILL: 8,
        K.CRASH_AFTER_PUBLISH: 8,
    },
)

FULL = Profile(
    name="full",
    messages=100_000,
    poison=1_000,
    malformed=1_000,
    workers=3,
    load_seconds=900.0,
    max_crash_after=60,
    drain_seconds=300.0,
    push_jobs=22_300,  # 20,070 distinct push jobs
    decode_poison=1_000,
    handler_timeouts=100,
    hangs=20,
    faults={
        K.SIGKILL: 60,
        K.CRASH_BEFORE_COMMIT: 12,
        K.CRASH_AFTER_COMMIT: 12,
        K.SIGTERM: 34,
        K.RABBITMQ_RESTART: 6,
        K.RABBITMQ_KILL: 6,
        K.POSTGRES_RESTART: 12,
        K.AMQP_RESET: 30,
        K.PG_RESET: 30,
        K.AMQP_HOLD: 10,
        K.PG_HOLD: 10,
        K.AMQP_LATENCY: 10,
        K.PG_LATENCY: 10,
        K.COMMIT_CUT: 30,
        K.CRASH_AFTER_SEND: 40,
        K.HTTP2_DROP: 20,
        K.RELAY_KILL: 30,
        K.CRASH_AFTER_PUBLISH: 20,
    },
)

PROFILES = {p.name: p for p in (CI, FULL)}


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterProfile:
    """The cluster run: broker node faults only, on a 3-node cluster."""

    name: str
    messages: int
    poison: int
    malformed: int
    workers: int
    load_seconds: float
    leader_kills: int  # SIGKILLs of the node leading the work queue, each restarted
    rolling_restarts: int  # rounds of: every node stopped cleanly and started, in turn
    nodes: int = 3
    drain_seconds: float = 240.0


CLUSTER_CI = ClusterProfile(
    name="cluster-ci",
    messages=1_500,
    poison=15,
    malformed=10,
    workers=3,
    load_seconds=90.0,
    leader_kills=3,
    rolling_restarts=1,
)

CLUSTER_FULL = ClusterProfile(
    name="cluster",
    messages=30_000,
    poison=150,
    malformed=100,
    workers=3,
    load_seconds=420.0,
    leader_kills=12,
    rolling_restarts=1,
)

CLUSTER_PROFILES = {p.name: p for p in (CLUSTER_CI, CLUSTER_FULL)}
