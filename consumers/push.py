"""A push batch, top to bottom: claim + intent -> commit -> send -> record -> commit -> ack.

A push cannot share our transaction, so the ledger brackets it:

1. one transaction claims each job's dedupe key and writes its targets as
   `sending`, leased to this worker, with ids derived from the dedupe key
   (a redelivered job instead leases the targets not yet sent). COMMIT;
2. no transaction open: send every leased target, concurrently, with those
   ids and the collapse ids set;
3. as the answers come, record them (`sent` with the provider's id, `failed`
   with the reason, or back to `claimed` to retry) and run the
   `on_invalid_token` hook for dead tokens: one transaction takes every answer
   that arrived while the previous one committed. Once all are in, ack.

A crash between the provider accepting and step 3's commit leaves the row
`sending`; once its lease expires a redelivery applies the UnknownOutcome
policy: RESEND with the same apns-id and collapse id (the device collapses the
duplicate), or SKIP. A live lease of another worker means it is sending right
now: the job waits in a delay tier, never a second send.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import asyncpg
import structlog

from consumers.dispatch import Dispatcher
from consumers.faults import CrashPoint, Faults
from consumers.items import Delivery, Item, Verdicts, decode_batch
from consumers.metrics import ConsumerMetrics
from consumers.push_job import InvalidPushJob, PushJob, parse_push_job
from consumers.rerun import DatabaseUnavailable, rerun_after_disconnect, rollback_quietly
from consumers.settings import WorkerSettings
from consumers.spec import DeadToken, HandlerSpec
from consumers.verdict import CANCELLED, DUPLICATE, EFFECT, REUSED, dead, describe, retry
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
    SendResult,
    SendStatus,
    TargetKey,
    UnknownOutcome,
    parse_message_id,
)
from providers import (
    InvalidDeviceToken,
    PermanentProviderError,
    Provider,
    ProviderReceipt,
    SendIds,
    Target,
    TransientProviderError,
    UnknownOutcomeError,
    send_ids,
)

log = structlog.get_logger(__name__)

T = TypeVar("T")

RECORD_WINDOW_SECONDS = 0.05  # how long answers gather before a recording transaction


@dataclass(slots=True)
class _Send:
    item: Item
    job: PushJob
    target: TargetKey
    device: Target
    ids: SendIds
    result: SendResult | None = None
    retry_after: float | None = None
    dead_token: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class _Claimed:
    """Step 1's outcome: the sends to make now, and the jobs decided without one."""

    sends: list[_Send]
    verdicts: Verdicts


def dedupe_key_text(key: DedupeKey) -> str:
    """The string the send ids derive from: stable for a job's whole life."""
    return f"{key.consumer}\0{key.tenant}\0{key.message_id}"


def redact(token: str) -> str:
    return f"{token[:6]}…" if len(token) > 8 else "…"


class PushRunner:
    """Runs push batches for one queue with one provider."""

    def __init__(
        self,
        *,
        spec: HandlerSpec,
        pool: asyncpg.Pool,
        inbox: Inbox,
        ledger: SendLedger,
        provider: Provider,
        dispatcher: Dispatcher,
        settings: WorkerSettings,
        faults: Faults,
        metrics: ConsumerMetrics,
    ) -> None:
        assert spec.push is not None
        self.spec = spec
        self.push = spec.push
        self.pool = pool
        self.inbox = inbox
        self.ledger = ledger
        self.provider = provider
        self.dispatcher = dispatcher
        self.settings = settings
        self.faults = faults
        self.metrics = metrics
        self.messages = Messages(inbox.schema)

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
        verdicts = claimed.verdicts
        if claimed.sends:
            unrecorded = await self._send_and_record(claimed.sends)
            verdicts = self._judge(claimed.sends, verdicts)
            for send in unrecorded:
                # Its answer is not recorded: the row stays `sending` under our
                # lease. Come back once that expired; the policy then decides.
                verdicts[send.item] = retry("ledger_unavailable", delay=self.push.lease_seconds + 1)
        for item in jobs:
            if item not in verdicts:  # claimed before, every target already answered
                decided.append((item, DUPLICATE))
        self.faults.reached(CrashPoint.AFTER_COMMIT)
        await self.dispatcher.settle(self.spec, [*decided, *verdicts.items()])

    async def _rerun(self, step: Callable[[], Awaitable[T]], *, size: int) -> T:
        return await rerun_after_disconnect(
            step,
            consumer=self.spec.queue,
            event="push_step_rerun",
            size=size,
            stalled=self.metrics.database_stalled,
        )

    async def _claim(self, jobs: dict[Item, PushJob]) -> _Claimed:
        """Step 1: claim jobs, write or lease their targets; commit before any send."""
        if not jobs:
            return _Claimed(sends=[], verdicts={})
        items = list(jobs)
        sends: list[_Send] = []
        verdicts: Verdicts = {}
        async with self.pool.acquire() as conn, conn.transaction():
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
                verdicts[item] = retry(
                    "send_in_progress", delay=busy[key] + 0.5, spend_attempt=False
                )
        return _Claimed(sends=sends, verdicts=verdicts)

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

    def _new_send(self, item: Item, job: PushJob, index: int, device: Target) -> _Send:
        assert item.envelope is not None
        key = item.envelope.key
        return _Send(
            item=item,
            job=job,
            target=TargetKey(key=key, target_index=index),
            device=device,
            ids=send_ids(dedupe_key_text(key), device.token, collapse_key=job.collapse_key),
        )

    async def _send_and_record(self, sends: list[_Send]) -> list[_Send]:
        """Steps 2 and 3, overlapped; returns the sends whose answers were not recorded.

        Every leased target is sent at once, with no transaction open, and the
        answers are recorded as they come: a recording transaction takes every
        answer that arrived within RECORD_WINDOW_SECONDS of the first one not
        yet recorded, or while the previous transaction ran (group commit). A
        crash then re-sends only what was in flight or not yet recorded, and a
        slow send does not hold back the records of the fast ones.
        """
        answered: list[_Send] = []
        arrived = asyncio.Event()
        everything = asyncio.Event()
        remaining = len(sends)

        async def send_one(send: _Send) -> None:
            nonlocal remaining
            answer: ProviderReceipt | BaseException = UnknownOutcomeError("send did not finish")
            try:
                answer = await self.provider.send(send.job.push_for(send.device), send.ids)
            except Exception as exc:  # translated by _result; a provider bug is unknown
                answer = exc
            finally:  # even cancelled, the send is counted, so the loop below ends
                send.result = self._result(send, answer)
                answered.append(send)
                arrived.set()
                remaining -= 1
                if remaining == 0:
                    everything.set()

        tasks = [asyncio.create_task(send_one(send)) for send in sends]
        unrecorded: list[_Send] = []
        recorded = 0
        try:
            while recorded < len(sends):
                await arrived.wait()
                # Answers of one batch come close together: give the rest a
                # moment, so a batch usually takes one recording transaction
                # and a slow straggler does not hold the others' records back.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(everything.wait(), RECORD_WINDOW_SECONDS)
                arrived.clear()
                group = answered[:]
                answered.clear()
                recorded += len(group)
                if group:
                    try:
                        await self._rerun(partial(self._record, group), size=len(group))
                    except DatabaseUnavailable:
                        unrecorded += group
        finally:
            # Never cancel a send on the wire; an error above waits for them.
            await asyncio.gather(*tasks, return_exceptions=True)
        return unrecorded

    def _result(self, send: _Send, answer: ProviderReceipt | BaseException) -> SendResult:
        target = send.target
        if isinstance(answer, ProviderReceipt):
            return SendResult(
                target=target,
                status=SendStatus.SENT,
                provider_message_id=answer.provider_message_id,
            )
        if isinstance(answer, InvalidDeviceToken):
            send.dead_token = True
            return SendResult(target=target, status=SendStatus.FAILED, failure_reason=answer.reason)
        if isinstance(answer, PermanentProviderError):
            return SendResult(target=target, status=SendStatus.FAILED, failure_reason=answer.reason)
        if isinstance(answer, TransientProviderError):
            send.retry_after = answer.retry_after
            return SendResult(
                target=target, status=SendStatus.CLAIMED, failure_reason=answer.reason
            )
        if isinstance(answer, asyncio.CancelledError):
            raise answer
        # UnknownOutcomeError, or any other failure mid-call: it may have been sent.
        reason = answer.reason if isinstance(answer, UnknownOutcomeError) else describe(answer)
        if self.push.unknown_outcome is UnknownOutcome.SKIP:
            return SendResult(
                target=target,
                status=SendStatus.FAILED,
                failure_reason=f"unknown_outcome_skipped: {reason}",
            )
        return SendResult(
            target=target, status=SendStatus.CLAIMED, failure_reason=f"unknown_outcome: {reason}"
        )

    async def _record(self, sends: list[_Send]) -> None:
        """Step 3: record these answers and prune dead tokens, in one transaction."""
        results = [s.result for s in sends if s.result is not None]
        async with self.pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            try:
                recorded = set(await self.ledger.record(conn, results))
                hook = self.push.on_invalid_token
                for send in sends:
                    if hook is not None and send.dead_token and send.target in recorded:
                        await hook(conn, self._dead_token(send))
                self.faults.reached(CrashPoint.AFTER_SEND)
            except BaseException:
                await rollback_quietly(tx)
                raise
            await tx.commit()  # <- answers durable; only now may the jobs be acked
        outcomes: dict[str, int] = {}
        for send in sends:
            self._log_send(send, recorded=send.target in recorded)
            if send.target in recorded:
                outcome = _push_outcome(send)
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
        self.metrics.pushes(self.provider.name, outcomes)

    def _dead_token(self, send: _Send) -> DeadToken:
        assert send.result is not None
        return DeadToken(
            tenant=send.target.key.tenant,
            message_id=send.target.key.message_id,
            platform=str(send.device.platform),
            token=send.device.token,
            reason=send.result.failure_reason or "",
        )

    def _judge(self, sends: list[_Send], claimed: Verdicts) -> Verdicts:
        """Each job's verdict from its targets' answers (`claimed` already decided)."""
        later: dict[Item, tuple[float | None, str]] = {}
        for send in sends:
            result = send.result
            assert result is not None
            if result.status is SendStatus.CLAIMED:
                after, _ = later.get(send.item, (None, ""))
                wanted = max(filter(None, (after, send.retry_after)), default=None)
                later[send.item] = (wanted, result.failure_reason or "")
        verdicts = dict(claimed)
        for send in sends:
            if send.item in verdicts:
                continue  # judged, or waiting on another worker's lease
            if send.item in later:
                wanted, why = later[send.item]
                reason = "unknown_outcome" if why.startswith("unknown") else "provider_unavailable"
                verdicts[send.item] = retry(reason, delay=wanted, error=why)
            else:
                verdicts[send.item] = EFFECT
        return verdicts

    def _log_send(self, send: _Send, *, recorded: bool) -> None:
        result = send.result
        assert result is not None
        fields = {
            "consumer": self.spec.queue,
            "tenant": send.target.key.tenant,
            "message_id": send.target.key.message_id,
            "attempt": send.item.envelope.attempt if send.item.envelope else 1,
            "target": send.target.target_index,
            "platform": str(send.device.platform),
            "token": redact(send.device.token),
            "provider": self.provider.name,
            "apns_id": send.ids.apns_id,
            "collapse_id": send.ids.collapse_id,
            "recorded": recorded,
        }
        if result.status is SendStatus.SENT:
            log.info("push_sent", provider_message_id=result.provider_message_id, **fields)
        elif send.dead_token:
            log.warning("invalid_token", reason=result.failure_reason, **fields)
        elif result.status is SendStatus.FAILED:
            log.warning("push_failed", reason=result.failure_reason, **fields)
        else:
            log.warning(
                "push_deferred",
                reason=result.failure_reason,
                retry_after=send.retry_after,
                **fields,
            )


def _push_outcome(send: _Send) -> str:
    """The `outcome` label of a recorded answer: sent, failed, invalid_token, deferred, unknown."""
    result = send.result
    assert result is not None
    if result.status is SendStatus.SENT:
        return "sent"
    if send.dead_token:
        return "invalid_token"
    if result.status is SendStatus.FAILED:
        return "failed"
    return "unknown" if (result.failure_reason or "").startswith("unknown") else "deferred"
