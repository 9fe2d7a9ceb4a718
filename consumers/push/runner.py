"""A push batch, top to bottom: claim + intent -> commit -> send -> record -> commit -> ack.

A push cannot share our transaction, so the ledger brackets it:

1. one transaction claims each job's dedupe key and writes its targets as
   `sending`, leased to this worker, with ids derived from the dedupe key
   (a redelivered job instead leases the targets not yet sent). COMMIT.
   Jobs decided here (duplicates, reused ids, a live lease) are settled now;
2. no transaction open: send every leased target, up to SENDS_IN_FLIGHT at
   once, with those ids and the collapse ids set. No send starts after its
   lease can have expired: each carries the lease's end, less LEASE_MARGIN
   to record its answer, as its deadline; one that cannot start with its
   whole timeout before it is not made (its row goes back to `claimed`);
3. as the answers come, record them (`sent`, `failed`, or back to `claimed`)
   and run `on_invalid_token` for dead tokens, one transaction for every
   answer that arrived while the previous one committed. A job whose answers
   are all recorded is settled then, on its own: a slow device holds back
   only its own job (and a channel runs several batches at once). Its ack
   goes through the channel's `AckWindow`: `multiple=True` up to the lowest
   delivery still in flight, or alone once held back too long.

A crash between the provider accepting and step 3's commit leaves the row
`sending`; once its lease expires a redelivery applies the UnknownOutcome
policy: RESEND with the same apns-id and collapse id (the device collapses the
duplicate), or SKIP. A live lease of another worker means it is sending right
now: the job waits in a delay tier, never a second send. A provider refusing
our credentials is paused (`consumers.push.circuit`); its jobs wait for its probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import asyncpg
import structlog

from consumers.handlers.faults import CrashPoint, Faults
from consumers.handlers.spec import HandlerSpec
from consumers.message.verdict import CANCELLED, DUPLICATE, REUSED, Verdict, dead, error_text, retry
from consumers.pipeline.acks import AckWindow
from consumers.pipeline.database_loss import (
    DatabaseUnavailable,
    rerun_after_disconnect,
    rollback_quietly,
)
from consumers.pipeline.deliveries import Delivery, Item, Verdicts, decode_batch
from consumers.pipeline.settle import Dispatcher
from consumers.push.answers import (
    Answered,
    Send,
    answered,
    dead_token,
    dedupe_key_text,
    job_verdict,
    log_answer,
    metric_outcomes,
    paused,
    probe_result,
    provider_name,
)
from consumers.push.circuit import Circuits
from consumers.push.job import InvalidPushJob, PushJob, parse_push_job
from consumers.settings import WorkerSettings
from consumers.telemetry.logs import outcome_lines
from consumers.telemetry.metrics import ConsumerMetrics
from dedupe import (
    INGRESS_HEADER,
    LEASE_EXPIRED,
    Claim,
    ClaimOutcome,
    DbConnection,
    DedupeKey,
    Inbox,
    Messages,
    SendIntent,
    SendLedger,
    SendStatus,
    TargetKey,
    parse_message_id,
    replicated,
)
from dedupe.lost import dropped_if_demoted
from providers import (
    Provider,
    ProviderReceipt,
    Target,
    UnknownOutcomeError,
    send_ids,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

RECORD_WINDOW_SECONDS = 0.05  # how long answers gather before a recording transaction
SENDS_IN_FLIGHT = 1000  # per runner: more would only queue inside the provider
LEASE_MARGIN = 0.1  # of the lease, kept at its end to record the last answers


@dataclass(frozen=True, slots=True, kw_only=True)
class _Claimed:
    """Step 1's outcome: the sends to make now, and the jobs decided without one."""

    sends: list[Send]
    verdicts: Verdicts
    deadline: float = 0.0  # time.monotonic() by which every answer must be in


class PushRunner:
    """Runs push batches for one queue with one provider; several batches at once."""

    def __init__(
        self,
        *,
        spec: HandlerSpec,
        pool: asyncpg.Pool,
        inbox: Inbox,
        ledger: SendLedger,
        provider: Provider,
        circuits: Circuits,
        dispatcher: Dispatcher,
        settings: WorkerSettings,
        faults: Faults,
        metrics: ConsumerMetrics,
        acks: AckWindow,
    ) -> None:
        assert spec.push is not None
        self.spec = spec
        self.push = spec.push
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
        self.messages = Messages(inbox.schema)
        self._window = asyncio.Semaphore(SENDS_IN_FLIGHT)

    async def run(self, deliveries: Sequence[Delivery]) -> None:
        decoded = decode_batch(deliveries, self.spec, self.settings.max_body_bytes)
        decided = list(decoded.decided)
        jobs: dict[Item, PushJob] = {}
        for item in decoded.pending:
            assert item.envelope is not None
            try:
                jobs[item] = parse_push_job(item.envelope.body)
            except InvalidPushJob as exc:
                decided.append((item, dead("invalid_push_job", error=str(exc))))
        try:
            claimed = await self._rerun(partial(self._claim, jobs), size=len(jobs))
        except DatabaseUnavailable as lost:
            claimed = _Claimed(sends=[], verdicts=dict.fromkeys(jobs, lost.verdict))
        sending = {send.item for send in claimed.sends}
        for item in jobs:
            if item in sending:
                continue  # settled once its answers are recorded
            # Claimed before with every target answered: a duplicate.
            decided.append((item, claimed.verdicts.get(item, DUPLICATE)))
        await self._settle(decided)
        if not claimed.sends:
            return
        settled: set[Item] = set()
        try:
            await self._send_and_record(claimed.sends, claimed.verdicts, claimed.deadline, settled)
        except Exception as exc:
            # A bug: the jobs not yet settled are retried; the settled ones are
            # acked already, so this must not reach the batch loop's isolation
            # (it would run them again, and a second ack closes the channel).
            log.exception("push_batch_failed", consumer=self.spec.queue, size=len(sending))
            error = retry("framework_error", error=error_text(exc))
            await self._settle([(item, error) for item in sending if item not in settled])

    async def _rerun(self, step: Callable[[], Awaitable[T]], *, size: int) -> T:
        return await rerun_after_disconnect(
            step,
            consumer=self.spec.queue,
            event="push_step_rerun",
            size=size,
            stalled=self.metrics.database_stalled,
        )

    async def _settle(self, decided: Sequence[tuple[Item, Verdict]]) -> None:
        if decided:
            self.faults.reached(CrashPoint.AFTER_COMMIT)
            await self.dispatcher.settle(self.spec, decided, acks=self.acks)

    async def _claim(self, jobs: dict[Item, PushJob]) -> _Claimed:
        """Step 1: claim jobs, write or lease their targets; commit before any send."""
        if not jobs:
            return _Claimed(sends=[], verdicts={})
        started = time.monotonic()  # the leases start later: on PostgreSQL's BEGIN
        items = list(jobs)
        sends: list[Send] = []
        verdicts: Verdicts = {}
        # A cancelled wait for the standby: unknown, the batch re-runs (dedupe.replication).
        async with (
            self.pool.acquire() as conn,
            dropped_if_demoted(conn),  # the re-run gets the new primary's connection
            replicated(conn),
            conn.transaction(),
        ):
            claims = [
                Claim(key=i.envelope.key, fingerprint=i.envelope.fingerprint)
                for i in items
                if i.envelope is not None
            ]
            outcomes = await self.inbox.claim(conn, claims)
            cancelled = await self._take_ingress(conn, items, outcomes)
            intents: list[SendIntent] = []
            seen_before: dict[DedupeKey, Item] = {}
            for item, outcome in zip(items, outcomes, strict=True):
                assert item.envelope is not None
                job = jobs[item]
                if outcome is ClaimOutcome.REUSED:
                    verdicts[item] = REUSED
                elif item in cancelled:
                    verdicts[item] = CANCELLED
                elif outcome is ClaimOutcome.DUPLICATE:
                    seen_before[item.envelope.key] = item
                else:
                    for index, device in enumerate(job.targets):
                        send = self._new_send(item, job, index, device)
                        sends.append(send)
                        intents.append(
                            SendIntent(
                                target=send.target,
                                platform=str(device.platform),
                                token=device.token,
                                apns_id=send.ids.apns_id,
                                collapse_id=send.ids.collapse_id,
                            )
                        )
            await self.ledger.open(conn, intents, self.push.lease_seconds)
            rows = await self.ledger.take(
                conn, list(seen_before), self.push.lease_seconds, self.push.unknown_outcome
            )
        busy: dict[DedupeKey, float] = {}
        mine = [row for row in rows if row.mine]
        self.metrics.taken_over(sum(row.failure_reason == LEASE_EXPIRED for row in mine))
        self.metrics.resent(
            sum((row.failure_reason or "").startswith("unknown_outcome") for row in mine)
        )
        for row in rows:
            item = seen_before[row.target.key]
            if row.mine:
                device = jobs[item].targets[row.target.target_index]
                sends.append(self._new_send(item, jobs[item], row.target.target_index, device))
            elif row.status is SendStatus.SENDING:
                busy[row.target.key] = max(busy.get(row.target.key, 0.0), row.lease_seconds_left)
        for key, item in seen_before.items():
            if key in busy:  # another worker is sending right now: the queue's 409
                # Back by the lease's end (a tier above it could hold the job
                # minutes longer); back too early, it waits again, spending no attempt.
                delay = self.spec.retry.tier_within(busy[key] + 0.5)
                verdicts[item] = retry("send_in_progress", delay=delay, spend_attempt=False)
        lease = self.push.lease_seconds
        return _Claimed(
            sends=sends, verdicts=verdicts, deadline=started + lease * (1 - LEASE_MARGIN)
        )

    async def _take_ingress(
        self, conn: DbConnection, items: list[Item], outcomes: list[ClaimOutcome]
    ) -> set[Item]:
        """New jobs sent through ingress: queued -> taken, the compare-and-set a cancel races.

        Returns the items whose message was cancelled first: they send nothing.
        """
        sent_for: dict[Item, uuid.UUID] = {}
        for item, outcome in zip(items, outcomes, strict=True):
            header = (item.delivery.headers or {}).get(INGRESS_HEADER)
            message = parse_message_id(header) if isinstance(header, str) else None
            if outcome is ClaimOutcome.NEW and message is not None:
                sent_for[item] = message
        if not sent_for:
            return set()
        cancelled = await self.messages.take(conn, list(sent_for.values()))
        return {item for item, message in sent_for.items() if message in cancelled}

    def _new_send(self, item: Item, job: PushJob, index: int, device: Target) -> Send:
        assert item.envelope is not None
        key = item.envelope.key
        return Send(
            item=item,
            job=job,
            target=TargetKey(key=key, target_index=index),
            device=device,
            ids=send_ids(dedupe_key_text(key), device.token, collapse_key=job.collapse_key),
            provider=provider_name(self.provider, device.platform),
        )

    async def _send_and_record(
        self, sends: list[Send], held: Verdicts, deadline: float, settled: set[Item]
    ) -> None:
        """Steps 2 and 3, overlapped; each job settled once its answers are recorded.

        Every leased target is sent, with no transaction open, and the answers
        are recorded as they come: a recording transaction takes every answer
        that arrived within RECORD_WINDOW_SECONDS of the first one not yet
        recorded, or while the previous transaction ran (group commit). A crash
        then re-sends only what was in flight or not yet recorded, and a slow
        send holds back neither the records nor the acks of the others' jobs.
        `held`: verdicts of jobs that also wait on another worker's lease.
        """
        arrived: list[Answered] = []
        new_answer = asyncio.Event()
        everything = asyncio.Event()
        remaining = len(sends)
        left: dict[Item, int] = {}
        for send in sends:
            left[send.item] = left.get(send.item, 0) + 1
        by_job: dict[Item, list[Answered]] = {item: [] for item in left}
        unrecorded: set[Item] = set()

        async def send_one(send: Send) -> None:
            nonlocal remaining
            cancelled: asyncio.CancelledError | None = None
            async with self._window:
                circuit = self.circuits.of(send.provider)
                if not circuit.admit():
                    answer = paused(send, circuit.reason or "", circuit.seconds_to_probe())
                else:
                    reply: ProviderReceipt | BaseException
                    try:
                        push = send.job.push_for(send.device)
                        reply = await self.provider.send(push, send.ids, deadline=deadline)
                    except asyncio.CancelledError as exc:  # counted below, then re-raised
                        cancelled, reply = exc, UnknownOutcomeError("Cancelled")
                    except Exception as exc:  # translated by answered(); a bug is unknown
                        reply = exc
                    circuit.observe(probe_result(reply), getattr(reply, "reason", ""))
                    answer = answered(send, reply, self.push.unknown_outcome)
            arrived.append(answer)
            new_answer.set()
            remaining -= 1
            if remaining == 0:
                everything.set()
            if cancelled is not None:
                raise cancelled

        tasks = [asyncio.create_task(send_one(send)) for send in sends]
        recorded = 0
        try:
            while recorded < len(sends):
                await new_answer.wait()
                # Answers of one batch come close together: give the rest a
                # moment, so a batch usually takes one recording transaction
                # and a slow straggler does not hold the others' records back.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(everything.wait(), RECORD_WINDOW_SECONDS)
                new_answer.clear()
                group = arrived[:]
                arrived.clear()
                recorded += len(group)
                if not group:
                    continue
                try:
                    await self._rerun(partial(self._record, group), size=len(group))
                except DatabaseUnavailable:
                    unrecorded.update(a.send.item for a in group)
                done: list[tuple[Item, Verdict]] = []
                for answer in group:
                    item = answer.send.item
                    by_job[item].append(answer)
                    left[item] -= 1
                    if left[item] == 0:
                        verdict = self._verdict(item, by_job.pop(item), held, unrecorded)
                        done.append((item, verdict))
                await self._settle(done)
                settled.update(item for item, _ in done)
        finally:
            # Never cancel a send on the wire; an error above waits for them.
            await asyncio.gather(*tasks, return_exceptions=True)

    def _verdict(
        self, item: Item, answers: list[Answered], held: Verdicts, unrecorded: set[Item]
    ) -> Verdict:
        if item in unrecorded:
            # An answer is not recorded: its row stays `sending` under our
            # lease. Come back once that expired; the policy then decides.
            return retry("ledger_unavailable", delay=self.push.lease_seconds + 1)
        if item in held:  # some targets wait on another worker's lease
            return held[item]
        return job_verdict(answers)

    async def _record(self, answers: list[Answered]) -> None:
        """Step 3: record these answers and prune dead tokens, in one transaction."""
        async with self.pool.acquire() as conn, dropped_if_demoted(conn):
            tx = conn.transaction()
            await tx.start()
            try:
                recorded = set(await self.ledger.record(conn, [a.result for a in answers]))
                hook = self.push.on_invalid_token
                for answer in answers:
                    if hook is not None and answer.dead_token and answer.send.target in recorded:
                        await hook(conn, dead_token(answer))
                self.faults.reached(CrashPoint.AFTER_SEND)
            except BaseException:
                await rollback_quietly(tx)
                raise
            async with replicated(conn):  # a cancelled wait for the standby: unknown
                await tx.commit()  # <- answers durable; only now may the jobs be acked
        lines = outcome_lines()  # the sent lines (most of them) without structlog's chain
        for answer in answers:
            recorded_now = answer.send.target in recorded
            log_answer(answer, consumer=self.spec.queue, recorded=recorded_now, lines=lines)
        if lines is not None:
            lines.flush()
        for provider, outcomes in metric_outcomes(answers, recorded).items():
            self.metrics.pushes(provider, outcomes)
