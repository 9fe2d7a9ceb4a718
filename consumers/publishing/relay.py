"""The outbox relay, top to bottom: claim -> publish -> confirm -> mark -> commit.

The guarantee: every row committed to the outbox is published with its own
message_id and body, at least once, and is marked published only after the
broker confirmed it. Read `Relay.relay_batch`, which is `_claim` then `_finish`:

1. BEGIN; claim up to `batch_size` pending rows, oldest first, with
   `FOR UPDATE SKIP LOCKED`: other relays (and this relay's other batches in
   flight) skip the rows we hold and we skip theirs, so any number of relays
   share the work and none holds a row twice;
2. publish every claimed row through the `Publisher` (mandatory, confirms,
   retried with the same message, all of them in flight at once); each
   publish resolves on its own confirm;
3. mark the confirmed rows published; leave the ones that failed
   (`Unroutable`, `NotConfirmed`) pending, postponed with backoff;
4. COMMIT. From here the marks are visible and no relay publishes them again.
   The relay commits with `synchronous_commit = off`: it does not wait for
   the WAL fsync. If PostgreSQL itself crashes in the next fraction of a
   second, a mark may be lost; its rows are then pending again and published
   once more, with the same message_id, as after a relay crash below.

A relay that dies anywhere before 4 (SIGKILL, a lost connection) takes its
transactions with it: the locks go, the rows are pending again, and the next
claim publishes them once more, with the same message_id. The consumer's
dedupe key absorbs that copy, so effects downstream still happen once. This
is at-least-once on the broker, exactly-once in effect. There is no
`id > last_seen` cursor: every claim asks for whatever is pending, so the rows
of a transaction that commits late are not skipped.

When to claim: one claimer per relay (`_claim_loop`). A trigger NOTIFYs
`idempotent_workers_outbox` (payload: the schema) when an inserting
transaction commits; the claimer LISTENs, and also polls every
`poll_interval_s` in case a notification was missed (the listening
connection lost, a relay started after the commit). It claims as soon as
rows may be pending and one of `concurrency` batch slots (a pooled
connection, a transaction) is free, and hands the batch to a task of its own
for steps 2 to 4: the next claim does not wait for the previous batch's
confirms, mark and commit. So a row committed while batches are in flight is
claimed at once (a slot free) or as soon as one finishes, together with
whatever else came meanwhile, and no fixed wait sits anywhere on the path.

Ordering: rows are claimed oldest first, but `concurrency` batches (and other
relays) run side by side and a failed publish is retried later, so no order
is promised, per key or otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from dataclasses import dataclass

import aio_pika
import asyncpg
import structlog
from asyncpg.transaction import Transaction

from consumers.broker.connection import connect
from consumers.handlers.faults import NO_FAULTS, CrashPoint, Faults
from consumers.publishing.publisher import (
    Job,
    Publisher,
    PublisherError,
    PublisherSettings,
    Unroutable,
)
from consumers.settings import RelaySettings, Settings
from consumers.telemetry.failed_start import START_FAILURES, start_failed
from dedupe import NOTIFY_CHANNEL, Outbox, OutboxRow, PublishFailure, check_schema, quote_ident
from dedupe.lost import drop_if_demoted

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Claimed:
    """Rows locked by an open transaction on a connection taken from the pool."""

    conn: asyncpg.pool.PoolConnectionProxy[asyncpg.Record]
    tx: Transaction
    rows: list[OutboxRow]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    claimed: int
    published: int
    failed: int


class Relay:
    """Publishes the outbox of one schema until `stop()`."""

    def __init__(self, settings: Settings, *, faults: Faults = NO_FAULTS) -> None:
        self.settings = settings
        self.relay_settings: RelaySettings = settings.relay
        self.outbox = Outbox(settings.database.schema)
        self.faults = faults
        self.published = 0  # rows marked published by this relay
        self._pool: asyncpg.Pool | None = None
        self._listener: asyncpg.Connection[asyncpg.Record] | None = None
        self._connection: aio_pika.abc.AbstractRobustConnection | None = None
        self._publisher: Publisher | None = None
        self._wake = asyncio.Event()
        self._listen_lock = asyncio.Lock()
        self._stopping = asyncio.Event()
        self._slots = asyncio.Semaphore(self.relay_settings.concurrency)  # batches in flight
        self._failures = 0  # claims and batches failed in a row: the claimer backs off
        self._claimer: asyncio.Task[None] | None = None
        self._batches: set[asyncio.Task[None]] = set()

    # -- one batch: the guarantee ----------------------------------------

    async def relay_batch(self) -> BatchResult:
        """Claim, publish, mark and commit one batch of pending rows."""
        claimed = await self._claim()
        if claimed is None:
            return BatchResult(claimed=0, published=0, failed=0)
        return await self._finish(claimed)

    async def _claim(self) -> _Claimed | None:
        """1. BEGIN and lock up to `batch_size` pending rows; None (rolled back) if none."""
        assert self._pool is not None
        conn = await self._pool.acquire()
        tx = conn.transaction()
        try:
            await tx.start()
            rows = await self.outbox.claim(conn, self.relay_settings.batch_size)  # 1.
        except BaseException as exc:
            drop_if_demoted(conn, exc)  # a demoted primary's: the pool connects anew
            await self._give_back(conn, tx)
            raise
        if not rows:
            await self._give_back(conn, tx)
            return None
        return _Claimed(conn=conn, tx=tx, rows=rows)

    async def _finish(self, claimed: _Claimed) -> BatchResult:
        """2. to 4. for a claimed batch; the connection goes back to the pool either way."""
        assert self._publisher is not None
        conn, rows = claimed.conn, claimed.rows
        try:
            errors = await self._publisher.publish_many([_job(r) for r in rows])  # 2.
            self.faults.reached(CrashPoint.AFTER_PUBLISH)
            confirmed = [r for r, e in zip(rows, errors, strict=True) if e is None]
            failures = [
                _postponed(r, e) for r, e in zip(rows, errors, strict=True) if e is not None
            ]
            await self.outbox.mark_published(conn, confirmed)  # 3.
            await self.outbox.postpone(conn, failures)
            await claimed.tx.commit()  # 4.
        except BaseException as exc:
            drop_if_demoted(conn, exc)
            await self._give_back(conn, claimed.tx)  # rolled back: the rows are pending again
            raise
        assert self._pool is not None
        await self._pool.release(conn)
        # 4. committed: the marks are visible, these rows are done.
        self.published += len(confirmed)
        for failure in failures:
            log.warning("outbox_publish_failed", row=failure.id, error=failure.error)
        return BatchResult(claimed=len(rows), published=len(confirmed), failed=len(failures))

    async def _give_back(
        self, conn: asyncpg.pool.PoolConnectionProxy[asyncpg.Record], tx: Transaction
    ) -> None:
        """Roll back (if it still can) and return the connection to the pool."""
        assert self._pool is not None
        with contextlib.suppress(Exception):
            await tx.rollback()
        await self._pool.release(conn)

    # -- around it: when to claim ------------------------------------------

    async def _claim_loop(self) -> None:
        """Claim whenever rows may be pending and a slot is free; finish each batch aside."""
        batch_size = self.relay_settings.batch_size
        while not self._stopping.is_set():
            if self._failures:
                # Nothing is lost: a failed batch rolled back, its rows are pending.
                await self._sleep(random.uniform(0, min(5.0, 0.1 * 2**self._failures)))
            await self._slots.acquire()
            if self._stopping.is_set():
                self._slots.release()
                return
            self._wake.clear()  # before the claim: a commit after it wakes us again
            try:
                claimed = await self._claim()
            except Exception as exc:
                self._slots.release()
                self._failures += 1
                log.warning("relay_claim_failed", error=repr(exc), failures=self._failures)
                continue
            if claimed is None:
                self._slots.release()
                await self._idle()
                continue
            batch = asyncio.create_task(self._finish_aside(claimed), name="relay:batch")
            self._batches.add(batch)
            batch.add_done_callback(self._batches.discard)
            if len(claimed.rows) < batch_size:
                await self._idle()  # at once if a commit came during the claim

    async def _finish_aside(self, claimed: _Claimed) -> None:
        try:
            await self._finish(claimed)
            self._failures = 0
        except Exception as exc:
            self._failures += 1
            log.warning("relay_batch_failed", error=repr(exc), failures=self._failures)
        finally:
            self._slots.release()

    async def _idle(self) -> None:
        await self._ensure_listening()
        wake = asyncio.create_task(self._wake.wait())
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait(
                {wake, stop},
                timeout=self.relay_settings.poll_interval_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            wake.cancel()
            stop.cancel()

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if payload == self.outbox.schema:
            self._wake.set()

    async def _ensure_listening(self) -> None:
        """(Re)open the LISTEN connection; without it the relay still polls."""
        async with self._listen_lock:
            if self._listener is not None and not self._listener.is_closed():
                return
            try:
                listener = await asyncpg.connect(self.settings.database.url, timeout=10)
                await listener.add_listener(NOTIFY_CHANNEL, self._notified)
            except Exception as exc:
                log.warning("relay_listen_failed", error=repr(exc))
                return
            self._listener = listener
            self._wake.set()  # anything committed while we were not listening

    # -- life cycle ----------------------------------------------------------

    async def start(self) -> None:
        db = self.settings.database
        rs = self.relay_settings
        self._pool = await asyncpg.create_pool(
            db.url,
            min_size=rs.concurrency,
            max_size=rs.concurrency,
            server_settings={
                "search_path": f"{quote_ident(db.schema)}, public",
                # A mark lost with PostgreSQL itself only republishes its rows
                # (same message_id): no need to wait for the fsync (step 4).
                "synchronous_commit": "off",
            },
        )
        async with self._pool.acquire() as conn:
            await check_schema(conn, db.schema)
        self._connection = await connect(self.settings.amqp.urls, name="idempotent-workers relay")
        channel = await self._connection.channel(publisher_confirms=True)
        self._publisher = Publisher(
            channel, PublisherSettings(window=max(rs.batch_size * rs.concurrency, 1))
        )
        await self._ensure_listening()
        self._claimer = asyncio.create_task(self._claim_loop(), name="relay:claim")
        log.info(
            "relay_started",
            schema=db.schema,
            batch_size=rs.batch_size,
            concurrency=rs.concurrency,
            poll_interval_s=rs.poll_interval_s,
        )

    async def stop(self) -> None:
        """Finish the batches in flight (within the grace), then close."""
        self._stopping.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.worker.shutdown_grace_seconds
        # The claimer first (it starts no batch once stopping), then what it started.
        for tasks in ([self._claimer] if self._claimer is not None else [], self._batches):
            if not tasks:
                continue
            _, pending = await asyncio.wait(set(tasks), timeout=max(0.0, deadline - loop.time()))
            for task in pending:
                task.cancel()  # its transaction rolls back: the rows stay pending
            await asyncio.gather(*pending, return_exceptions=True)
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
        if self._pool is not None:
            with contextlib.suppress(Exception):
                await self._pool.close()
        log.info("relay_stopped", schema=self.settings.database.schema, published=self.published)


async def run_relay(settings: Settings, *, faults: Faults = NO_FAULTS) -> int:
    """Relay until SIGTERM or SIGINT; the batches in flight finish first. Exit status 0.

    A start a service failed (PostgreSQL or RabbitMQ not answering) is one
    `start_failed` line and EXIT_START_FAILED, as for `run`.
    """
    relay = Relay(settings, faults=faults)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_requested.set)
    try:
        try:
            await relay.start()
        except START_FAILURES as error:
            return start_failed(error)
        await stop_requested.wait()
    finally:
        await relay.stop()
    return 0


def _job(row: OutboxRow) -> Job:
    return Job(
        queue=row.queue,
        body=row.body,
        message_id=row.message_id,
        tenant=row.tenant,
        headers=row.headers or None,
    )


def _postponed(row: OutboxRow, error: PublisherError) -> PublishFailure:
    """Back off per row: full jitter over 1 s * 2**attempts, at most 60 s."""
    kind = "unroutable" if isinstance(error, Unroutable) else "not_confirmed"
    return PublishFailure(
        id=row.id,
        error=f"{kind}: {error}",
        retry_after_s=random.uniform(0, min(60.0, 2.0**row.attempts)),
    )
