"""Step 1 of an effects batch: claim the jobs, write or lease their targets, one transaction.

A new job's recipients (its kind says whom: `consumers.jobs.kind`) are written
with the ids every attempt will carry, the first CHUNK_TARGETS `sending` under
this batch's lease and the rest `claimed` (`consumers.effects.sending` leases
them chunk by chunk); a job claimed before leases a chunk of what is not yet
sent, each target read back from its row. Jobs decided here (a reused id, a
cancelled send, every target answered, another worker's live lease, no
recipient at all) get their verdict without a send.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from consumers.effects.answers import Send, dedupe_key_text, sender_for
from consumers.effects.lease import Lease
from consumers.effects.sending import CHUNK_TARGETS, JobProgress, takeable
from consumers.handlers.spec import HandlerSpec
from consumers.jobs.kind import Recipient
from consumers.message.verdict import CANCELLED, EFFECT, REUSED, retry
from consumers.pipeline.deliveries import Item, Verdicts
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
    SendRow,
    SendStatus,
    TargetKey,
    UnknownOutcome,
    parse_message_id,
    replicated,
)
from dedupe.lost import dropped_if_demoted
from providers import JobIds, RecoveryKind, Sender, SendIds, job_ids


@dataclass(frozen=True, slots=True, kw_only=True)
class Claimed:
    """Step 1's outcome: the sends to make now, and the jobs decided without one."""

    sends: list[Send]
    verdicts: Verdicts
    jobs: list[JobProgress]  # the jobs with targets leased to this batch
    lease: Lease | None = None  # theirs


class ClaimStep:
    """Step 1 for one queue's batches."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        inbox: Inbox,
        ledger: SendLedger,
        provider: Sender[Any],
        spec: HandlerSpec,
        metrics: ConsumerMetrics,
    ) -> None:
        assert spec.effects is not None
        self.pool = pool
        self.inbox = inbox
        self.ledger = ledger
        self.provider = provider
        self.spec = spec
        self.effects = spec.effects
        self.kind = spec.effects.kind
        self.metrics = metrics
        self.messages = Messages(inbox.schema)

    async def claim(self, jobs: dict[Item, Any]) -> Claimed:
        """Step 1: claim jobs, write or lease their targets; commit before any send."""
        if not jobs:
            return Claimed(sends=[], verdicts={}, jobs=[])
        started = time.monotonic()  # the leases start later: on PostgreSQL's BEGIN
        items = list(jobs)
        sends: list[Send] = []
        verdicts: Verdicts = {}
        progress: list[JobProgress] = []
        expiry = None
        lease_seconds = self.effects.lease_seconds
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
            seen_before: dict[DedupeKey, Item] = {}
            new: list[Item] = []
            for item, outcome in zip(items, outcomes, strict=True):
                assert item.envelope is not None
                if outcome is ClaimOutcome.REUSED:
                    verdicts[item] = REUSED
                elif item in cancelled:
                    verdicts[item] = CANCELLED
                elif outcome is ClaimOutcome.DUPLICATE:
                    seen_before[item.envelope.key] = item
                else:
                    new.append(item)
            intents = await self._open(conn, new, jobs, sends, progress, verdicts)
            if intents:
                expiry = await self.ledger.open(conn, intents, lease_seconds, leased=CHUNK_TARGETS)
            rows = await self.ledger.take(
                conn,
                list(seen_before),
                lease_seconds,
                self.unknown_outcome,
                limit=CHUNK_TARGETS,
            )
        mine = [row for row in rows if row.mine]
        self.metrics.taken_over(sum(row.failure_reason == LEASE_EXPIRED for row in mine))
        self.metrics.resent(
            sum((row.failure_reason or "").startswith("unknown_outcome") for row in mine)
        )
        by_job: dict[DedupeKey, list[SendRow]] = {}
        for row in rows:
            by_job.setdefault(row.target.key, []).append(row)
            expiry = row.lease_expires_at if row.mine else expiry
        for key, item in seen_before.items():
            of_job = by_job.get(key, [])
            busy = [
                r.lease_seconds_left
                for r in of_job
                if r.status is SendStatus.SENDING and not r.mine
            ]
            if any(busy):  # another worker is sending right now: the queue's 409
                # Back by the lease's end (a tier above it could hold the job
                # minutes longer); back too early, it waits again, spending no attempt.
                delay = self.spec.retry.tier_within(max(busy) + 0.5)
                verdicts[item] = retry("send_in_progress", delay=delay, spend_attempt=False)
            leased = [r for r in of_job if r.mine]
            if not leased:  # a duplicate, or every target waits on another worker
                continue
            job = jobs[item]
            again = JobProgress(
                item=item,
                job=job,
                takeable=takeable(of_job),
                waits=verdicts.get(item),
                ids=self.ids_of(item, job),  # derived only for a job with sends of ours
            )
            sends += [self.send_of_row(again, row, started) for row in leased]
            progress.append(again)
        lease = None
        if expiry is not None and progress:
            lease = Lease(
                self.ledger,
                expires_at=expiry,
                ends=started + lease_seconds,
                lease_seconds=lease_seconds,
            )
        return Claimed(sends=sends, verdicts=verdicts, jobs=progress, lease=lease)

    @property
    def unknown_outcome(self) -> UnknownOutcome:
        """The ledger's policy for an expired lease (`unknown_outcome_policy`)."""
        return unknown_outcome_policy(self.effects.unknown_outcome, self.provider)

    async def _open(
        self,
        conn: DbConnection,
        new: list[Item],
        jobs: dict[Item, Any],
        sends: list[Send],
        progress: list[JobProgress],
        verdicts: Verdicts,
    ) -> list[SendIntent]:
        """The intents of the new jobs: whom each goes to, asked of its kind once, with the
        ids every attempt will carry; the sends of the first chunk of each appended to
        `sends`. A job with no recipient at all is done (`EFFECT`): nothing to send."""
        if not new:
            return []
        asked = [(item.envelope.key.tenant, jobs[item]) for item in new if item.envelope]
        recipients = await self.kind.recipients(conn, asked)
        intents: list[SendIntent] = []
        for item, whom in zip(new, recipients, strict=True):
            assert item.envelope is not None
            if not whom:
                verdicts[item] = EFFECT
                continue
            job = jobs[item]
            first = min(len(whom), CHUNK_TARGETS)
            started = JobProgress(
                item=item, job=job, takeable=len(whom) - first, ids=self.ids_of(item, job)
            )
            key = item.envelope.key
            for index, recipient in enumerate(whom):
                ids = started.ids.for_address(recipient.address)
                intents.append(
                    SendIntent(
                        target=TargetKey(key=key, target_index=index),
                        channel=recipient.channel,
                        address=recipient.address,
                        effect_id=ids.effect_id,
                        collapse_id=ids.collapse_id,
                    )
                )
                if index < first:
                    sends.append(new_send(self.provider, started, index, recipient, ids))
            progress.append(started)
        return intents

    def ids_of(self, item: Item, job: Any) -> JobIds:
        """The ids every effect of a job shares, derived once per job (`JobProgress.ids`)."""
        assert item.envelope is not None
        return job_ids(dedupe_key_text(item.envelope.key), collapse_key=self.kind.collapse_key(job))

    def send_of_row(self, progress: JobProgress, row: SendRow, started: float) -> Send:
        """The send of a row leased to us by a statement that began after `started`
        (`time.monotonic()`): a replay window read then ends no later than it says."""
        recipient = Recipient(channel=row.channel, address=row.address)
        window = self.provider.recovery.window_seconds
        window_ends = None
        if window is not None and row.since_first_lease is not None:
            window_ends = started + window - row.since_first_lease
        return new_send(
            self.provider,
            progress,
            row.target.target_index,
            recipient,
            previous=row.sends - 1,
            window_ends=window_ends,
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


def unknown_outcome_policy(policy: UnknownOutcome, provider: Sender[Any]) -> UnknownOutcome:
    """What an expired lease becomes: the queue's policy for a channel that offers neither
    replay nor lookup; for the others RESEND, since their send step replays within the
    window only, or asks the provider first (`consumers.effects.sending`)."""
    if provider.recovery.kind is RecoveryKind.NEITHER:
        return policy
    return UnknownOutcome.RESEND


def new_send(
    provider: Sender[Any],
    progress: JobProgress,
    index: int,
    recipient: Recipient,
    ids: SendIds | None = None,
    *,
    previous: int = 0,
    window_ends: float | None = None,
) -> Send:
    """The send of a job's target `index` (`ids`: its own, when derived already)."""
    item = progress.item
    assert item.envelope is not None
    return Send(
        item=item,
        job=progress.job,
        target=TargetKey(key=item.envelope.key, target_index=index),
        recipient=recipient,
        ids=ids if ids is not None else progress.ids.for_address(recipient.address),
        provider=sender_for(provider, recipient.channel).name,
        previous=previous,
        window_ends=window_ends,
    )
