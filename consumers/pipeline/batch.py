"""One batch, top to bottom: decode -> claim -> effect -> commit -> ack.

This module is the guarantee. Read `BatchRunner.run`:

1. decode every delivery; bad input is dead-lettered, never run;
2. BEGIN; claim every key in one statement; run the handlers of the new keys
   with `ctx.tx`; write staged effects with one `executemany` per statement;
   COMMIT. Effects and claims commit together or not at all. With the next
   batch already waiting, the COMMIT carries its BEGIN (COMMIT AND CHAIN,
   `consumers.pipeline.held`);
3. only then: publish retries and dead letters (confirmed), then ack.

A handler that raises (any type: its exceptions are its own) or runs past its
deadline fails the fast path; the batch is rolled back and run again with a
savepoint per message (or, for a batch handler, split in halves), so the
failing message alone is retried or dead-lettered and the others' effects
still commit exactly once; a handler past its deadline is not run a second
time. The fast path's deadline is one timer for the whole batch
(`consumers.pipeline.deadline`); the careful path pays a timer per handler.

A failure of the framework's own database calls (a lost connection, a commit
whose outcome is unknown, a COMMIT whose wait for the synchronous standby was
cancelled, a handler's connection found closed) re-runs the
whole batch once the database answers: the claims make a repeat harmless, and
nothing is acked before a commit. A database that stays away through every
re-run raises DatabaseUnavailable, and each message of the batch is retried
through the delay tiers.

Verdicts travel by return value: decoding returns the ones it reached, the
transaction returns one per claimed item, and `Dispatcher.settle` takes the pairs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import asyncpg
import structlog

from consumers.handlers.context import Batch, Context
from consumers.handlers.faults import CrashPoint, Faults
from consumers.handlers.spec import HandlerSpec
from consumers.message.decisions import Reject, Retry
from consumers.message.verdict import DUPLICATE, EFFECT, REUSED, Verdict, dead, error_text, retry
from consumers.pipeline.acks import AckWindow
from consumers.pipeline.database_loss import (
    DatabaseUnavailable,
    rerun_after_disconnect,
    rollback_quietly,
)
from consumers.pipeline.deadline import Deadline, HandlerTimeout
from consumers.pipeline.deliveries import Delivery, Item, Verdicts, decode_batch
from consumers.pipeline.held import HeldConnection
from consumers.pipeline.settle import Dispatcher
from consumers.pipeline.traced import open_batch, step
from consumers.settings import WorkerSettings
from consumers.telemetry.metrics import ConsumerMetrics
from consumers.telemetry.tracing import Span, tracing
from dedupe import Claim, ClaimOutcome, DbConnection, Inbox, Outbox, replicated
from dedupe.lost import (
    CONNECTION_ERRORS,
    TRANSIENT_SQL_ERRORS,
    DatabaseConnectionClosed,
    dropped_if_demoted,
)

log = structlog.get_logger(__name__)


class _HandlerFailed(Exception):
    """The fast path hit a handler's exception (its cause): re-run the batch carefully."""

    def __init__(self, *, claimed: Verdicts, fresh: list[Item], timed_out: Item | None) -> None:
        super().__init__()
        self.claimed = claimed  # the others' verdicts, from their claims
        self.fresh = fresh  # the messages whose handlers ran
        self.timed_out = timed_out  # the message whose handler ran past its deadline


class BatchRunner:
    """Runs batches for one handler. Stateless between batches but for counters."""

    def __init__(
        self,
        *,
        spec: HandlerSpec,
        pool: asyncpg.Pool,
        inbox: Inbox,
        dispatcher: Dispatcher,
        settings: WorkerSettings,
        faults: Faults,
        metrics: ConsumerMetrics,
        hold_connection: bool = True,
    ) -> None:
        self.spec = spec
        self.pool = pool
        # One batch at a time: the connection stays from one batch to the next.
        self.connection = HeldConnection(pool, hold=hold_connection)
        self.inbox = inbox
        self.outbox = Outbox(inbox.schema)  # ctx.emit() writes here, in the batch's transaction
        self.dispatcher = dispatcher
        self.settings = settings
        self.faults = faults
        self.metrics = metrics
        self.acks: AckWindow | None = None  # a batch's multiple ack covers its channel
        # Set by the worker to its loop's: deliveries are buffered for another batch.
        self.next_batch_waiting: Callable[[], bool] = _nothing_waiting
        # Past this a handler is cancelled and its message retried (consumers.pipeline.deadline).
        self.deadline = (
            spec.timeout if spec.timeout is not None else settings.handler_timeout_seconds
        )

    async def run(self, deliveries: Sequence[Delivery], started: Callable[[], None]) -> None:
        """Decide, commit and acknowledge every delivery of the batch.

        Its loop runs one batch at a time (the slot holds the next back), so
        nothing waits on `started`.
        """
        decoded = decode_batch(deliveries, self.spec, self.settings.max_body_bytes)
        traces = tracing()
        batch = None
        if traces.on:  # a span per message and one for the batch (consumers.pipeline.traced)
            batch = open_batch(
                traces, self.spec.queue, [*(i for i, _ in decoded.decided), *decoded.pending]
            )
        verdicts: Verdicts = {}
        if decoded.pending:
            began = time.perf_counter()
            try:
                verdicts = await rerun_after_disconnect(
                    lambda: self._transact(decoded.pending, batch),
                    consumer=self.spec.queue,
                    event="batch_rerun",
                    size=len(decoded.pending),
                    stalled=self.metrics.database_stalled,
                )
            except DatabaseUnavailable as lost:
                verdicts = dict.fromkeys(decoded.pending, lost.verdict)
            self.metrics.commit_seconds.observe(time.perf_counter() - began)
        self.faults.reached(CrashPoint.AFTER_COMMIT)
        await self.dispatcher.settle(self.spec, [*decoded.decided, *verdicts.items()])
        if batch is not None:
            batch.end()

    async def _transact(self, items: list[Item], batch: Span | None) -> Verdicts:
        """One transaction for the batch; returns every item's verdict."""
        try:
            return await self._attempt(items, careful=False, batch=batch)
        except _HandlerFailed as failed:
            cause = failed.__cause__
            assert isinstance(cause, Exception)
            if len(failed.fresh) == 1:
                # Nothing else to commit: no need to run it a second time.
                return {**failed.claimed, failed.fresh[0]: self._judge(cause)}
            # A handler past its deadline is not run again: it would only hang again.
            known = {failed.timed_out: self._judge(cause)} if failed.timed_out else {}
            return await self._attempt(items, careful=True, known=known, batch=batch)

    async def _attempt(
        self,
        items: list[Item],
        *,
        careful: bool,
        known: Verdicts | None = None,
        batch: Span | None = None,
    ) -> Verdicts:
        # A demoted primary's connection is closed: the re-run gets the new primary's.
        async with self.connection.acquired() as conn, dropped_if_demoted(conn):
            tx = await self.connection.begin(conn)  # BEGIN, or the last COMMIT's chain
            try:
                claiming = step(tracing(), "claim", batch, keys=len(items))
                outcomes = await self.inbox.claim(
                    conn,
                    [
                        Claim(key=i.envelope.key, fingerprint=i.envelope.fingerprint)
                        for i in items
                        if i.envelope is not None
                    ],
                )
                if claiming is not None:
                    claiming.end()
                verdicts: Verdicts = {}
                fresh: list[Item] = []
                for item, outcome in zip(items, outcomes, strict=True):
                    if outcome is ClaimOutcome.NEW:
                        fresh.append(item)
                    else:
                        verdicts[item] = DUPLICATE if outcome is ClaimOutcome.DUPLICATE else REUSED
                if careful:
                    effects = await self._effects_careful(conn, fresh, known or {})
                    failed = [i for i, v in effects.items() if v is not EFFECT]
                    await self.inbox.release(conn, [i.envelope.key for i in failed if i.envelope])
                    verdicts.update(effects)
                else:
                    await self._effects_fast(conn, fresh, verdicts)
                    verdicts.update(dict.fromkeys(fresh, EFFECT))
                self.faults.reached(CrashPoint.BEFORE_COMMIT)
            except BaseException:
                await rollback_quietly(tx)
                raise
            committing = step(tracing(), "commit", batch, new=len(fresh))
            async with replicated(conn):  # a cancelled wait for the standby: unknown, re-run
                # <- effects and claims are durable from here on; with the next batch
                # waiting, its BEGIN goes in the same round trip (COMMIT AND CHAIN)
                await self.connection.commit(conn, tx, chain=self.next_batch_waiting())
            if committing is not None:
                committing.end()
        return verdicts

    async def close(self) -> None:
        """Give the connection held between batches back to the pool."""
        await self.connection.release()

    async def _effects_fast(self, conn: DbConnection, fresh: list[Item], claimed: Verdicts) -> None:
        """No savepoints, one deadline timer: any handler error means the careful path."""
        staged: dict[str, list[Sequence[Any]]] = {}
        contexts = [self._context(conn, i, staged) for i in fresh]
        timed = self.metrics.handler_seconds
        running: Item | None = None
        try:
            with Deadline(self.deadline) as deadline:
                if self.spec.handle_batch is not None:
                    if contexts:
                        began = time.perf_counter()
                        deadline.lap(began)
                        await self.spec.handle_batch(Batch(tx=conn, messages=contexts))
                        timed.observe(time.perf_counter() - began)
                else:
                    assert self.spec.handle is not None
                    for item, ctx in zip(fresh, contexts, strict=True):
                        running = item
                        began = time.perf_counter()
                        deadline.lap(began)
                        if item.span is None:
                            await self.spec.handle(ctx)
                        else:  # its log lines carry the message's trace
                            with tracing().current(item.span):
                                await self.spec.handle(ctx)
                        timed.observe(time.perf_counter() - began)
        except Exception as exc:  # the handler's, whatever its type
            _check_connection(conn, exc)
            timed_out = running if isinstance(exc, HandlerTimeout) else None
            raise _HandlerFailed(claimed=claimed, fresh=fresh, timed_out=timed_out) from exc
        try:
            for sql, rows in staged.items():
                await conn.executemany(sql, rows)
        except CONNECTION_ERRORS:
            raise
        except Exception as exc:  # a staged statement of a handler failed
            raise _HandlerFailed(claimed=claimed, fresh=fresh, timed_out=None) from exc

    async def _effects_careful(
        self, conn: DbConnection, fresh: list[Item], known: Verdicts
    ) -> Verdicts:
        """A savepoint and a deadline per message (or per half of a batch); a verdict for each."""
        verdicts = {item: known[item] for item in fresh if item in known}
        runnable = [item for item in fresh if item not in known]
        if self.spec.handle_batch is not None:
            verdicts.update(await self._bisect(conn, runnable))
            return verdicts
        assert self.spec.handle is not None
        for item in runnable:
            savepoint = conn.transaction()
            await savepoint.start()
            try:
                with Deadline(self.deadline), tracing().current(item.span):
                    await self.spec.handle(self._context(conn, item, None))
            except Exception as exc:  # the handler's, whatever its type
                _check_connection(conn, exc)
                await savepoint.rollback()  # the framework's call: raises if the database is gone
                verdicts[item] = self._judge(exc)
            else:
                await savepoint.commit()
                verdicts[item] = EFFECT
        return verdicts

    async def _bisect(self, conn: DbConnection, items: list[Item]) -> Verdicts:
        if not items:
            return {}
        assert self.spec.handle_batch is not None
        savepoint = conn.transaction()
        await savepoint.start()
        try:
            with Deadline(self.deadline):
                await self.spec.handle_batch(
                    Batch(tx=conn, messages=[self._context(conn, i, None) for i in items])
                )
        except Exception as exc:  # the handler's, whatever its type
            _check_connection(conn, exc)
            await savepoint.rollback()
            if len(items) == 1:
                return {items[0]: self._judge(exc)}
            middle = len(items) // 2
            verdicts = await self._bisect(conn, items[:middle])
            verdicts.update(await self._bisect(conn, items[middle:]))
            return verdicts
        await savepoint.commit()
        return dict.fromkeys(items, EFFECT)

    def _context(
        self, conn: DbConnection, item: Item, staged: dict[str, list[Sequence[Any]]] | None
    ) -> Context:
        envelope = item.envelope
        assert envelope is not None
        return Context(
            tx=conn,
            body=envelope.body,
            message_id=envelope.message_id,
            tenant=envelope.tenant,
            attempt=envelope.attempt,
            consumer=self.spec.queue,
            staged=staged,
            outbox=self.outbox,
            trace_headers=partial(tracing().headers, item.span) if item.span is not None else None,
        )

    def _judge(self, exc: Exception) -> Verdict:
        """The verdict for a message whose handler raised `exc`."""
        if isinstance(exc, HandlerTimeout):
            return retry("handler_timeout", error=error_text(exc))
        if isinstance(exc, Reject):
            return dead(exc.reason)
        if isinstance(exc, Retry):
            return retry(exc.reason, delay=exc.delay)
        if isinstance(exc, TRANSIENT_SQL_ERRORS):
            return retry("transient_database_error", error=error_text(exc))
        if isinstance(exc, self.spec.retry.retry_on):
            return retry("handler_error", error=error_text(exc))
        return dead("handler_error", error=error_text(exc))


def _nothing_waiting() -> bool:
    """A runner no loop feeds: no batch is known to be waiting."""
    return False


def _check_connection(conn: DbConnection, exc: Exception) -> None:
    """A handler raised `exc`: the handler's failure, unless its connection is closed."""
    if conn.is_closed():
        raise DatabaseConnectionClosed(error_text(exc)) from exc
