"""The fault schedule: which faults, when, and what each one did.

A profile says how many faults of each kind; `timeline()` spreads them at
random over the load phase, and `Injector.run()` fires them on time. Service
restarts take turns (one lock), everything else may overlap. Kills at the
crash points are not on the timeline: worker starts are armed from a quota
(see `fleet.py`), and those kills happen when the worker reaches the point.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import structlog

from proving.chaos.fleet import Fleet
from proving.chaos.proxy import FaultProxy
from proving.chaos.services import PrivatePostgres, PrivateRabbit

log = structlog.get_logger(__name__)


class FaultKind(StrEnum):
    SIGKILL = "sigkill"  # a random worker, SIGKILL
    CRASH_BEFORE_COMMIT = "crash_before_commit"  # the worker kills itself there
    CRASH_AFTER_COMMIT = "crash_after_commit"
    CRASH_AFTER_SEND = "crash_after_send"  # the provider answered, not yet recorded
    RELAY_KILL = "relay_kill"  # a random outbox relay process, SIGKILL
    CRASH_AFTER_PUBLISH = "crash_after_publish"  # a relay's batch confirmed, not yet marked
    SIGTERM = "sigterm"  # rolling: every worker in turn (counted per worker)
    RABBITMQ_RESTART = "rabbitmq_restart"  # clean stop, start
    RABBITMQ_KILL = "rabbitmq_kill"  # SIGKILL of the Erlang VM, start
    POSTGRES_RESTART = "postgres_restart"  # immediate mode (SIGQUIT), start
    AMQP_RESET = "amqp_reset"  # RST of every worker connection to RabbitMQ
    PG_RESET = "pg_reset"  # RST of every worker connection to PostgreSQL
    AMQP_HOLD = "amqp_hold"  # half-open for a few seconds, then RST
    PG_HOLD = "pg_hold"
    PG_LATENCY = "pg_latency"  # 20-100 ms on every chunk for a few seconds
    AMQP_LATENCY = "amqp_latency"
    COMMIT_CUT = "commit_cut"  # a COMMIT forwarded, its reply never delivered
    HTTP2_DROP = "http2_drop"  # every HTTP/2 connection to the fake APNs cut
    # Scripted at the fakes per device token (counted from what they served):
    PROVIDER_410 = "provider_410"
    PROVIDER_429 = "provider_429"
    PROVIDER_5XX = "provider_5xx"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_DROP = "provider_drop"


CRASHES = (
    FaultKind.CRASH_BEFORE_COMMIT,
    FaultKind.CRASH_AFTER_COMMIT,
    FaultKind.CRASH_AFTER_SEND,
    FaultKind.CRASH_AFTER_PUBLISH,
)
SCRIPTED = (
    FaultKind.PROVIDER_410,
    FaultKind.PROVIDER_429,
    FaultKind.PROVIDER_5XX,
    FaultKind.PROVIDER_TIMEOUT,
    FaultKind.PROVIDER_DROP,
)
SCHEDULED = tuple(k for k in FaultKind if k not in CRASHES + SCRIPTED)
RESTARTS = (FaultKind.RABBITMQ_RESTART, FaultKind.RABBITMQ_KILL, FaultKind.POSTGRES_RESTART)
RESTART_COOLDOWN_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    at: float  # seconds after the load phase began
    kind: FaultKind


def timeline(counts: Mapping[FaultKind, int], seconds: float, rng: random.Random) -> list[Event]:
    """The scheduled faults over the middle of `seconds`.

    Most kinds fall uniformly at random. Service restarts are spread evenly
    (with jitter), kinds interleaved: a restart takes 5 to 12 s and they take
    turns, so random times would pile several into one long outage.
    """
    events = [
        Event(at=rng.uniform(0.03, 0.9) * seconds, kind=kind)
        for kind, n in counts.items()
        if kind in SCHEDULED and kind not in RESTARTS
        for _ in range(n)
    ]
    restarts = [kind for kind in RESTARTS for _ in range(counts.get(kind, 0))]
    rng.shuffle(restarts)
    slot = 0.87 * seconds / max(len(restarts), 1)
    events += [
        Event(at=0.03 * seconds + slot * (n + rng.uniform(0.2, 0.8)), kind=kind)
        for n, kind in enumerate(restarts)
    ]
    return sorted(events, key=lambda e: e.at)


@dataclass(slots=True, kw_only=True)
class FaultLog:
    injected: Counter[FaultKind] = field(default_factory=Counter)
    affected: Counter[FaultKind] = field(default_factory=Counter)  # connections or workers hit
    downtime: dict[FaultKind, float] = field(default_factory=dict)  # seconds, for restarts
    fired_at: list[tuple[float, FaultKind]] = field(default_factory=list)  # wall clock


class Injector:
    def __init__(
        self,
        *,
        fleet: Fleet,
        rabbit: PrivateRabbit,
        postgres: PrivatePostgres,
        amqp_proxy: FaultProxy,
        pg_proxy: FaultProxy,
        rng: random.Random,
        journal: Path | None = None,
        drop_http2: Callable[[], None] | None = None,
        relays: Fleet | None = None,
    ) -> None:
        self.drop_http2 = drop_http2
        self.relays = relays
        self.journal = journal
        self.fleet = fleet
        self.rabbit = rabbit
        self.postgres = postgres
        self.amqp_proxy = amqp_proxy
        self.pg_proxy = pg_proxy
        self.rng = rng
        self.log = FaultLog()
        self._restart_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, events: list[Event]) -> None:
        """Fire `events` on time, then wait for the ones still running."""
        started = time.monotonic()
        for event in events:
            if (wait := started + event.at - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            task = asyncio.create_task(self._fire(event.kind), name=f"fault:{event.kind}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def _fire(self, kind: FaultKind) -> None:
        self.log.fired_at.append((time.time(), kind))
        hit = 1
        if kind is FaultKind.SIGKILL:
            hit = int(self.fleet.sigkill())
        elif kind is FaultKind.RELAY_KILL:
            hit = int(self.relays.sigkill()) if self.relays is not None else 0
        elif kind is FaultKind.SIGTERM:
            hit = await self.fleet.rolling_sigterm()
            if self.relays is not None:
                hit += await self.relays.rolling_sigterm()
        elif kind in RESTARTS:
            async with self._restart_lock:
                began = time.monotonic()
                if kind is FaultKind.POSTGRES_RESTART:
                    await self.postgres.restart(crash=True)
                else:
                    await self.rabbit.restart(crash=kind is FaultKind.RABBITMQ_KILL)
                self.log.downtime[kind] = (
                    self.log.downtime.get(kind, 0.0) + time.monotonic() - began
                )
        elif kind is FaultKind.AMQP_RESET:
            hit = self.amqp_proxy.reset()
        elif kind is FaultKind.PG_RESET:
            hit = self.pg_proxy.reset()
        elif kind in (FaultKind.AMQP_HOLD, FaultKind.PG_HOLD):
            proxy = self.amqp_proxy if kind is FaultKind.AMQP_HOLD else self.pg_proxy
            hit = proxy.connections
            await proxy.hold(self.rng.uniform(2.0, 8.0))
        elif kind in (FaultKind.AMQP_LATENCY, FaultKind.PG_LATENCY):
            proxy = self.amqp_proxy if kind is FaultKind.AMQP_LATENCY else self.pg_proxy
            hit = proxy.connections
            await proxy.delay(self.rng.uniform(0.02, 0.1), self.rng.uniform(2.0, 6.0))
        elif kind is FaultKind.HTTP2_DROP:
            if self.drop_http2 is not None:
                self.drop_http2()
            else:
                hit = 0
        elif kind is FaultKind.COMMIT_CUT:
            self.pg_proxy.arm_commit_cut()  # counted when it fires: see `record_cuts`
            hit = 0
        if kind is not FaultKind.SIGTERM:
            self.log.injected[kind] += 1 if kind is not FaultKind.COMMIT_CUT else 0
        else:
            self.log.injected[kind] += hit
        self.log.affected[kind] += hit
        log.info("fault_injected", kind=str(kind), affected=hit)
        if self.journal is not None:
            with self.journal.open("a") as out:
                out.write(f"{time.strftime('%H:%M:%S')} {kind} affected={hit}\n")

    def record_cuts(self) -> None:
        """Commit cuts count once they happened, not when they were armed."""
        self.log.injected[FaultKind.COMMIT_CUT] = self.pg_proxy.cuts_done
        self.log.affected[FaultKind.COMMIT_CUT] = self.pg_proxy.cuts_done

    def record_crashes(self) -> None:
        fleets = [self.fleet, *([self.relays] if self.relays is not None else [])]
        for fleet in fleets:
            for point, n in fleet.counts.crashed_at.items():
                kind = FaultKind(f"crash_{point}")
                self.log.injected[kind] = n
                self.log.affected[kind] = n

    def record_scripts(self, served: Mapping[str, int]) -> None:
        """Provider faults scripted per token count once a fake served them."""
        for name, n in served.items():
            self.log.injected[FaultKind(name)] = n
            self.log.affected[FaultKind(name)] = n
