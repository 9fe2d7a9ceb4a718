"""The worker process: connections, consumers, batch loops, graceful stop.

Every queue of every handler is checked against what the broker holds before
any is declared (`consumers.broker.conflicts`: a conflict is a
`TopologyConflict`, and nothing is declared). Then for each handler the
worker declares the topology, opens `concurrency` channels with `prefetch`
each (`push_prefetch` for an effects queue, and one more on its bulk lane with
`bulk_prefetch`), and runs one batch loop per channel (an effects queue's loops
hold at most `push_held_devices` targets between them, by tenant, and share one
provider gate).
A loop takes everything buffered (up to `max_batch`) as soon as the previous
batch is settled: no timer, so a quiet queue gets latency of one commit and a
busy one gets large batches.

`stop()` (SIGTERM in the CLI): cancel the consumers, finish and commit the
batches already delivered, ack them, close. What the grace period does not
cover stays unacked and the broker redelivers it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aio_pika
import asyncpg
import structlog

from consumers.broker.conflicts import check_broker
from consumers.broker.connection import connect
from consumers.broker.consume import DirectConsumer
from consumers.broker.headers import read_leniently
from consumers.broker.topology import declarations, declare
from consumers.effects.circuit import Circuits, CircuitState, CircuitView
from consumers.effects.lease import check_lease, check_recovery
from consumers.effects.quota import FleetQuotas
from consumers.effects.runner import EffectsRunner
from consumers.handlers.app import App
from consumers.handlers.spec import HandlerSpec
from consumers.message.decisions import ConfigurationError
from consumers.message.verdict import error_text
from consumers.pipeline.acks import AckWindow
from consumers.pipeline.batch import BatchRunner
from consumers.pipeline.deadline import longest_deadline
from consumers.pipeline.loop import BatchLoop
from consumers.pipeline.runner import Runner
from consumers.pipeline.settle import Dispatcher
from consumers.publishing.relay import Relay
from consumers.runtime.effects_queue import EffectsShared, effects_shared, lanes
from consumers.runtime.pool import create_pool
from consumers.runtime.replication import check_replication
from consumers.settings import Settings
from consumers.telemetry.health import CHECK_TIMEOUT_SECONDS, Status
from consumers.telemetry.metrics import Metrics
from dedupe import Inbox, SendLedger, TableStats, check_schema, table_stats
from providers import Sender

log = structlog.get_logger(__name__)

EFFECTS_BATCHES_AT_ONCE = 8  # per channel: a slow target holds back only its own batch


class Worker:
    """Consumes every queue of `app` until `stop()`."""

    def __init__(
        self,
        app: App,
        settings: Settings | None = None,
        *,
        log_effects: bool = True,
        metrics: Metrics | None = None,
    ) -> None:
        if not app.specs:
            raise ConfigurationError("the app has no handlers")
        self.app = app
        self.settings = settings or Settings()
        self.metrics = metrics if metrics is not None else Metrics()
        ws = self.settings.worker
        # How long a handler may hold the event loop or a transaction before
        # something stronger than its deadline steps in: the watchdog ends the
        # process (`run`), the server ends the session (every worker).
        self.stuck_after = (
            longest_deadline(app.specs.values(), ws.handler_timeout_seconds)
            + ws.watchdog_grace_seconds
        )
        # The send-lease owner: unique per process, also across PID reuse.
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._providers: dict[str, Sender[Any]] = {}
        self._circuits: dict[str, Circuits] = {}
        self.log_effects = log_effects
        self.pool: asyncpg.Pool | None = None
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        # Each batch loop with its task, registered together before its consume:
        # a consume the broker refuses leaves a running loop that only `stop()`'s
        # `cancel()` ends (else the stop waits its whole grace on it).
        self._loops: dict[BatchLoop, asyncio.Task[None]] = {}
        self._relay: Relay | None = None
        self._quotas: FleetQuotas | None = None  # the fleet's provider quotas, when any is set
        self._hold_connections = False
        self._started = False
        self._stopping = False
        self._closed = asyncio.Event()

    async def start(self) -> None:
        db = self.settings.database
        amqp = self.settings.amqp
        ws = self.settings.worker
        read_leniently()  # a key that is not UTF-8 must not cost the connection
        needed = ws.concurrency * len(self.app.specs)  # one connection per batch in flight
        # A local-effect loop keeps its connection between batches
        # (consumers.pipeline.held) while that leaves one for everything else.
        self._hold_connections = needed < db.pool_size
        self.pool = await create_pool(
            self.settings,
            min_size=min(needed, db.pool_size),
            name=f"idempotent-workers {self.worker_id}",
            backstop_seconds=self.stuck_after,
        )
        async with self.pool.acquire() as conn:
            await check_schema(conn, db.schema)
            await check_replication(conn, db, self.metrics)  # said at start, or refused
        if self.settings.quotas.limits:
            self._quotas = FleetQuotas(self.settings, self.pool, self.metrics)
            await self._quotas.start()
        await self._check_topology()  # before any queue is declared
        self._connection = await connect(amqp.urls, name=f"idempotent-workers {self.worker_id}")
        confirm_channel = await self._connection.channel(publisher_confirms=True)
        dispatcher = Dispatcher(confirm_channel, log_effects=self.log_effects, metrics=self.metrics)
        inbox = Inbox(db.schema)
        for spec in self.app.specs.values():
            await self._start_queue(spec, dispatcher, inbox)
        if self.settings.relay.in_run:
            self._relay = Relay(self.settings, faults=self.app.faults)
            await self._relay.start()
        self._started = True
        log.info(
            "worker_started",
            worker=self.worker_id,
            queues=list(self.app.specs),
            prefetch=ws.prefetch,
            push_prefetch=ws.push_prefetch,
            push_held_devices=ws.push_held_devices,
            max_batch=ws.max_batch,
            concurrency=ws.concurrency,
        )

    async def _check_topology(self) -> None:
        """Raise TopologyConflict if a queue exists otherwise (`consumers.broker.conflicts`)."""
        amqp = self.settings.amqp
        await check_broker(
            amqp.urls,
            [
                declaration
                for spec in self.app.specs.values()
                for declaration in declarations(
                    spec.queue, spec.retry, amqp, bulk=spec.effects is not None
                )
            ],
        )

    async def _provider(self, spec: HandlerSpec) -> Sender[Any]:
        """The queue's sender, built once inside the running loop."""
        assert spec.effects is not None
        if spec.queue not in self._providers:
            provider = self._providers[spec.queue] = await spec.effects.provider()
            check_lease(spec.queue, spec.effects.lease_seconds, provider)  # else no send starts
            check_recovery(spec.queue, provider)  # a channel that offers lookup has one
            if self._quotas is not None:
                self._quotas.check(provider)
        return self._providers[spec.queue]

    def _circuits_of(self, spec: HandlerSpec) -> Circuits:
        """The queue's provider circuits, shared by its batch loops."""
        assert spec.effects is not None
        if spec.queue not in self._circuits:
            probe = spec.effects.probe_seconds
            self._circuits[spec.queue] = Circuits(spec.queue, probe_seconds=probe)
        return self._circuits[spec.queue]

    def provider_circuits(self) -> list[CircuitView]:
        """Every effects queue's provider circuits: health and metrics read them.

        A provider whose circuit is not `closed` refused our credentials or
        configuration and is paused (see `consumers.effects.circuit`); the worker is
        not ready while one is.
        """
        return [view for circuits in self._circuits.values() for view in circuits.views()]

    async def _start_queue(self, spec: HandlerSpec, dispatcher: Dispatcher, inbox: Inbox) -> None:
        assert self._connection is not None and self.pool is not None
        ws = self.settings.worker
        effects = spec.effects
        if effects is None:
            for n in range(ws.concurrency):
                await self._consume(spec, spec.queue, ws.prefetch, n, dispatcher, inbox, None)
            return
        # Its kind, given this worker's pool and settings.
        effects = replace(effects, kind=effects.kind.bound(self.pool, self.settings))
        spec = replace(spec, effects=effects)
        shared = effects_shared(effects.kind, self.settings)
        for lane in lanes(spec.queue, self.settings):
            await self._consume(spec, lane.queue, lane.prefetch, lane.n, dispatcher, inbox, shared)

    async def _consume(
        self,
        spec: HandlerSpec,
        queue_name: str,
        prefetch: int,
        n: int,
        dispatcher: Dispatcher,
        inbox: Inbox,
        shared: EffectsShared | None,
    ) -> None:
        """One channel consuming `queue_name` (the handler's queue, or its bulk lane) into
        a batch loop of its own; an effects queue's loops share `shared`."""
        assert self._connection is not None and self.pool is not None
        ws = self.settings.worker
        effects = spec.effects
        channel = await self._connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch)
        if n == 0 and queue_name == spec.queue:
            await declare(
                channel, spec.queue, spec.retry, self.settings.amqp, bulk=effects is not None
            )
        # Declared (passively) on the robust channel, not `get_queue(ensure=False)`:
        # only queues the channel knows get their consumers back after a reconnect.
        queue = await channel.declare_queue(queue_name, passive=True)
        runner: Runner
        if effects is not None:
            assert shared is not None
            runner = EffectsRunner(
                spec=spec,
                pool=self.pool,
                inbox=inbox,
                ledger=SendLedger(self.settings.database.schema, self.worker_id),
                provider=await self._provider(spec),
                circuits=self._circuits_of(spec),
                dispatcher=dispatcher,
                settings=ws,
                faults=self.app.faults,
                metrics=self.metrics.consumer(spec.queue),
                acks=AckWindow(),
                holding=shared.holding,
                gate=shared.gate,
                quotas=self._quotas,
            )
        else:
            runner = BatchRunner(
                spec=spec,
                pool=self.pool,
                inbox=inbox,
                dispatcher=dispatcher,
                settings=ws,
                faults=self.app.faults,
                metrics=self.metrics.consumer(spec.queue),
                hold_connection=self._hold_connections,
            )
        at_once = EFFECTS_BATCHES_AT_ONCE if effects is not None else 1
        loop = BatchLoop(
            runner,
            ws.max_batch,
            self.metrics.consumer(spec.queue),
            at_once=at_once,
            holding=None if shared is None else shared.holding,
        )
        if isinstance(runner, BatchRunner):
            runner.next_batch_waiting = loop.next_batch_waiting
        loop.queue = queue
        self._loops[loop] = asyncio.create_task(loop.run(), name=f"batch-loop:{queue_name}:{n}")
        loop.consumer_tag = await queue.consume(DirectConsumer(loop.on_delivery))

    async def stop(self) -> None:
        """Stop consuming, settle what was delivered, close. Idempotent."""
        if self._stopping:
            await self._closed.wait()
            return
        self._stopping = True
        grace = self.settings.worker.shutdown_grace_seconds
        log.info("worker_stopping", worker=self.worker_id, grace_s=grace)
        for loop in self._loops:
            await loop.cancel()
        if self._loops:
            _, pending = await asyncio.wait(self._loops.values(), timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            unsettled = sum(len(loop.buffer) for loop in self._loops)
            if pending or unsettled:
                log.warning("shutdown_grace_exceeded", unsettled=unsettled)
        if self._relay is not None:
            await _close_logged("relay", self._relay.stop)
        # Everything delivered is settled or left to redelivery by now: a close
        # that fails is logged and the rest still closes.
        if self._connection is not None:
            await _close_logged("amqp_connection", self._connection.close)
        for provider in self._providers.values():
            await _close_logged(f"provider:{provider.name}", provider.aclose)
        if self._quotas is not None:
            await _close_logged("provider_quotas", self._quotas.close)
        if self.pool is not None:
            await _close_logged("database_pool", self.pool.close)
        log.info("worker_stopped", worker=self.worker_id)
        self._closed.set()

    async def readiness(self) -> Status:
        """Connected to RabbitMQ and PostgreSQL, consuming, no provider circuit open.

        Also moves the circuit gauges: the readiness check runs every few
        seconds, which is as often as they need to move.
        """
        problems: list[str] = []
        if self._stopping:
            problems.append("stopping")
        elif not self._started:
            problems.append("starting")
        connection = self._connection
        if connection is None or connection.is_closed or not connection.connected.is_set():
            problems.append("rabbitmq: not connected")
        elif any(loop.queue is not None and loop.queue.channel.is_closed for loop in self._loops):
            problems.append("rabbitmq: a consuming channel is closed")
        if self.pool is None:
            problems.append("postgresql: not connected yet")
        else:
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                    await self.pool.fetchval("SELECT 1")
            except Exception as exc:
                problems.append(
                    f"postgresql: {error_text(exc) if str(exc) else type(exc).__name__}"
                )
        for view in self.provider_circuits():
            if view.state is not CircuitState.CLOSED:
                problems.append(f"{view.consumer}: provider {view.provider} paused ({view.reason})")
        for view in self.provider_circuits():
            paused = view.state is not CircuitState.CLOSED
            self.metrics.circuit_open.labels(view.consumer, view.provider).set(1 if paused else 0)
        if problems:
            return Status(ok=False, detail="; ".join(problems))
        return Status(ok=True, detail=f"consuming {len(self.app.specs)} queue(s)")

    async def table_stats(self) -> TableStats | None:
        """The dedupe table's size and oldest claim, for a scrape; None before start."""
        if self.pool is None:
            return None
        async with self.pool.acquire() as conn:
            return await table_stats(conn, self.settings.database.schema)

    async def wait_stopped(self) -> None:
        """Return once `stop()` (from a signal handler, say) has closed everything."""
        await self._closed.wait()

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()


async def _close_logged(what: str, close: Callable[[], Awaitable[object]]) -> None:
    """Await `close()`; log a failure with its traceback instead of raising it.

    A CancelledError that is not a cancellation of this task (a library
    handing its closing future's exception on) counts as a failure too.
    """
    try:
        await close()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.error("close_failed", what=what, exc_info=True)
    except Exception:
        log.exception("close_failed", what=what)
