"""An effects batch, top to bottom: claim + intent -> commit -> send -> record -> commit -> ack.

An external effect (a push, a webhook call, an e-mail, an API call) cannot share
our transaction, so the send ledger brackets it, the same way for every kind;
the queue's `EffectKind` (`consumers.jobs.kind`) says what a job asks for:

1. one transaction claims each job's dedupe key and writes its targets (whom
   its kind says it goes to), the first chunk of each `sending`, leased to
   this worker, the rest `claimed`, with ids derived from the dedupe key (a
   redelivered job instead leases a chunk of the targets not yet sent). COMMIT.
   Jobs decided here (duplicates, reused ids, a live lease) are settled now;
2. no transaction open: send every leased target, at most `max_in_flight` at
   once per provider, with those ids and the collapse ids set. No send starts
   after its lease can have expired: each starts only while the lease leaves
   the provider's whole answer time before its end, less LEASE_MARGIN to record
   the answer. The lease follows the work (`consumers.effects.lease`): renewed
   while the batch makes progress, the next chunk leased as the last one is
   under way (`consumers.effects.sending`), no send started once a renewal
   failed. A target called before goes as its channel allows: replayed within
   the provider's window, looked up first, or sent again (`providers.Recovery`);
3. as the answers come, record them (`sent`, `failed`, or back to `claimed`)
   and run the kind's `gone` and the app's `on_invalid_token` for dead
   targets, one transaction for every
   answer that arrived while the previous one committed. A job whose answers
   are all recorded, with no target left to lease, is settled then, on its
   own: a slow device holds back only its own job (and a channel runs several
   batches at once). Its ack goes through the channel's `AckWindow`:
   `multiple=True` up to the lowest delivery still in flight, or alone once
   held back too long.

A crash between the provider accepting and step 3's commit leaves the row
`sending`; once its lease expires a redelivery resolves it as the channel
allows: within the replay window with the same key, by a lookup, or, for a
channel that offers neither, by the UnknownOutcome policy: RESEND with the same
ids (the device collapses the duplicate, a webhook receiver dedupes by
`webhook-id`), or SKIP. A live lease of another worker means it is sending
right now: the job waits in a delay tier, never a second send. A provider
refusing our credentials is paused (`consumers.effects.circuit`); its jobs wait
for its probe.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import asyncpg
import structlog

from consumers.effects.answers import (
    Answered,
    Send,
    dead_target,
    job_verdict,
    log_answer,
    metric_outcomes,
)
from consumers.effects.circuit import Circuits
from consumers.effects.claim import Claimed, ClaimStep
from consumers.effects.gate import ProviderGate
from consumers.effects.lease import Lease
from consumers.effects.quota import FleetQuotas
from consumers.effects.sending import CHUNK_TARGETS, Fanout, JobProgress
from consumers.handlers.faults import CrashPoint, Faults
from consumers.handlers.spec import HandlerSpec
from consumers.jobs.kind import InvalidJob, invalid_job_reason
from consumers.message.verdict import DUPLICATE, Verdict, dead, error_text, retry
from consumers.pipeline.acks import AckWindow
from consumers.pipeline.database_loss import (
    DatabaseUnavailable,
    rerun_after_disconnect,
    rollback_quietly,
)
from consumers.pipeline.deliveries import Decoded, Delivery, Item, decode_batch
from consumers.pipeline.holding import Holding
from consumers.pipeline.settle import Dispatcher
from consumers.pipeline.traced import open_batch, step
from consumers.settings import WorkerSettings
from consumers.telemetry.logs import outcome_lines
from consumers.telemetry.metrics import ConsumerMetrics
from consumers.telemetry.tracing import Span, tracing
from dedupe import (
    Inbox,
    Messages,
    SendLedger,
    SendRow,
    replicated,
)
from dedupe.lost import dropped_if_demoted
from providers import Sender

log = structlog.get_logger(__name__)

T = TypeVar("T")


class EffectsRunner:
    """Runs effects batches for one queue with one sender; several batches at once."""

    def __init__(
        self,
        *,
        spec: HandlerSpec,
        pool: asyncpg.Pool,
        inbox: Inbox,
        ledger: SendLedger,
        provider: Sender[Any],
        circuits: Circuits,
        dispatcher: Dispatcher,
        settings: WorkerSettings,
        faults: Faults,
        metrics: ConsumerMetrics,
        acks: AckWindow,
        holding: Holding | None = None,
        gate: ProviderGate | None = None,
        quotas: FleetQuotas | None = None,
    ) -> None:
        assert spec.effects is not None
        self.spec = spec
        self.effects = spec.effects
        self.kind = spec.effects.kind
        self.pool = pool
        self.inbox = inbox
        self.ledger = ledger
        self.provider = provider
        self.circuits = circuits
        self.dispatcher = dispatcher
        self.settings = settings
        self.faults = faults
        self.metrics = metrics
        self.acks = acks  # the channel's: jobs settle out of order
        self.holding = holding  # the queue's targets held: a settled job gives its own back
        self.messages = Messages(inbox.schema)
        # The runner's batches share the provider, with the queue's other runners.
        self._gate = gate if gate is not None else ProviderGate()
        self.quotas = quotas  # the fleet's provider quotas (consumers.effects.quota)
        self.claims = ClaimStep(
            pool=pool, inbox=inbox, ledger=ledger, provider=provider, spec=spec, metrics=metrics
        )

    async def run(self, deliveries: Sequence[Delivery], started: Callable[[], None]) -> None:
        decoded = decode_batch(deliveries, self.spec, self.settings.max_body_bytes)
        traces = tracing()
        batch = None
        if traces.on:  # a span per job and one for the batch (consumers.pipeline.traced)
            batch = open_batch(
                traces, self.spec.queue, [*(i for i, _ in decoded.decided), *decoded.pending]
            )
        try:
            await self._run(decoded, started, batch)
        finally:
            if batch is not None:
                batch.end()

    async def _run(self, decoded: Decoded, started: Callable[[], None], batch: Span | None) -> None:
        decided = list(decoded.decided)
        jobs: dict[Item, Any] = {}
        for item in decoded.pending:
            assert item.envelope is not None
            try:
                jobs[item] = self.kind.parse(item.envelope.body)
            except InvalidJob as exc:
                decided.append((item, dead(invalid_job_reason(self.kind.name), error=str(exc))))
        claiming = step(tracing(), "claim", batch, keys=len(jobs))
        try:
            claimed = await self._rerun(partial(self.claims.claim, jobs), size=len(jobs))
        except DatabaseUnavailable as lost:
            claimed = Claimed(sends=[], verdicts=dict.fromkeys(jobs, lost.verdict), jobs=[])
        finally:
            if claiming is not None:
                claiming.end()
        sending = {p.item for p in claimed.jobs}
        for item in jobs:
            if item in sending:
                continue  # settled once its answers are recorded
            # Claimed before with every target answered: a duplicate.
            decided.append((item, claimed.verdicts.get(item, DUPLICATE)))
        await self.settle(decided)
        if claimed.lease is None:
            return
        settled: set[Item] = set()
        fanout = Fanout(
            effects=self.effects,
            pool=self.pool,
            provider=self.provider,
            circuits=self.circuits,
            gate=self._gate,
            lease=claimed.lease,
            steps=self,
            batch=batch,
            quotas=self.quotas,
        )
        try:
            await fanout.run(claimed.jobs, claimed.sends, settled, started)
        except Exception as exc:
            # A bug: the jobs not yet settled are retried; the settled ones are
            # acked already, so this must not reach the batch loop's isolation
            # (it would run them again, and a second ack closes the channel).
            log.exception("effects_batch_failed", consumer=self.spec.queue, size=len(sending))
            error = retry("framework_error", error=error_text(exc))
            await self.settle([(item, error) for item in sending if item not in settled])

    async def _rerun(self, step: Callable[[], Awaitable[T]], *, size: int) -> T:
        return await rerun_after_disconnect(
            step,
            consumer=self.spec.queue,
            event="effects_step_rerun",
            size=size,
            stalled=self.metrics.database_stalled,
        )

    async def close(self) -> None:
        """Nothing is kept between batches: each takes its connections from the pool."""

    async def settle(self, decided: Sequence[tuple[Item, Verdict]]) -> None:
        if decided:
            self.faults.reached(CrashPoint.AFTER_COMMIT)
            try:
                await self.dispatcher.settle(self.spec, decided, acks=self.acks)
            finally:
                if self.holding is not None:  # room for the next job's devices
                    self.holding.release(item.delivery for item, _ in decided)

    def new_send(self, progress: JobProgress, row: SendRow, started: float) -> Send:
        return self.claims.send_of_row(progress, row, started)

    async def take_chunks(self, items: list[Item], lease: Lease) -> list[SendRow] | None:
        """The next chunk of each of these jobs, leased at the batch's expiry."""
        keys = [i.envelope.key for i in items if i.envelope is not None]

        async def take() -> list[SendRow]:
            # A cancelled wait for the standby: unknown, re-run (dedupe.replication).
            async with (
                self.pool.acquire() as conn,
                dropped_if_demoted(conn),  # the re-run gets the new primary's connection
                replicated(conn),
                conn.transaction(),
            ):
                return await self.ledger.take(
                    conn,
                    keys,
                    self.effects.lease_seconds,
                    self.claims.unknown_outcome,
                    limit=CHUNK_TARGETS,
                    held=lease.expires_at,
                )

        try:
            return await self._rerun(take, size=len(keys))
        except DatabaseUnavailable:
            return None

    def verdict(self, progress: JobProgress) -> Verdict:
        """A job's verdict once the targets this batch leased are answered (or lost)."""
        if progress.unrecorded:
            # An answer is not recorded: its row stays `sending` under our
            # lease. Come back once that expired; the policy then decides.
            return retry("ledger_unavailable", delay=self.effects.lease_seconds + 1)
        if progress.waits is not None:  # some targets wait on another worker's lease
            return progress.waits
        if progress.takeable:  # the lease was lost before every target was leased
            return retry("send_not_started", delay=0.0, spend_attempt=False)
        return job_verdict(progress.answers)

    async def record(self, answers: list[Answered], batch: Span | None = None) -> bool:
        """Step 3, re-run after a lost connection; False once the database is unavailable."""
        recording = step(tracing(), "record", batch, answers=len(answers))
        try:
            await self._rerun(partial(self._record, answers), size=len(answers))
        except DatabaseUnavailable:
            return False
        finally:
            if recording is not None:
                recording.end()
        return True

    async def _record(self, answers: list[Answered]) -> None:
        """Step 3: record these answers and deal with dead targets, in one transaction."""
        async with self.pool.acquire() as conn, dropped_if_demoted(conn):
            tx = conn.transaction()
            await tx.start()
            try:
                recorded = await self.ledger.record(conn, [a.result for a in answers])
                if len(recorded) == len(answers):  # the common case: no lookup per answer
                    kept = [True] * len(answers)
                else:  # some leases were taken over: those answers are the other worker's
                    mine = set(recorded)
                    kept = [answer.send.target in mine for answer in answers]
                hook = self.effects.on_invalid_token
                for answer, ours in zip(answers, kept, strict=True):
                    if answer.dead_target and ours:
                        dead = dead_target(answer)
                        await self.kind.gone(conn, dead)
                        if hook is not None:
                            await hook(conn, dead)
                self.faults.reached(CrashPoint.AFTER_SEND)
            except BaseException:
                await rollback_quietly(tx)
                raise
            async with replicated(conn):  # a cancelled wait for the standby: unknown
                await tx.commit()  # <- answers durable; only now may the jobs be acked
        lines = outcome_lines()  # the sent lines (most of them) without structlog's chain
        for answer, ours in zip(answers, kept, strict=True):
            log_answer(answer, consumer=self.spec.queue, kind=self.kind, recorded=ours, lines=lines)
        if lines is not None:
            lines.flush()
        counted = (answer for answer, ours in zip(answers, kept, strict=True) if ours)
        for provider, outcomes in metric_outcomes(counted).items():
            self.metrics.effects(self.kind.name, provider, outcomes)
