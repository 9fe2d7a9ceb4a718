"""Step 1 of a push batch: claim the jobs, write or lease their targets, one transaction.

A new job's targets are written with the ids every attempt will carry, the
first CHUNK_TARGETS `sending` under this batch's lease and the rest `claimed`
(`consumers.push.sending` leases them chunk by chunk); a job claimed before
leases a chunk of what is not yet sent. Jobs decided here (a reused id, a
cancelled send, every target answered, another worker's live lease) get their
verdict without a send.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import asyncpg

from consumers.handlers.spec import HandlerSpec
from consumers.message.verdict import CANCELLED, REUSED, retry
from consumers.pipeline.deliveries import Item, Verdicts
from consumers.push.answers import Send, dedupe_key_text, provider_name
from consumers.push.job import PushJob
from consumers.push.lease import Lease
from consumers.push.sending import CHUNK_TARGETS, JobProgress, takeable
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
    parse_message_id,
    replicated,
)
from dedupe.lost import dropped_if_demoted
from providers import JobIds, Provider, SendIds, job_ids


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
        provider: Provider,
        spec: HandlerSpec,
        metrics: ConsumerMetrics,
    ) -> None:
        assert spec.push is not None
        self.pool = pool
        self.inbox = inbox
        self.ledger = ledger
        self.provider = provider
        self.spec = spec
        self.push = spec.push
        self.metrics = metrics
        self.messages = Messages(inbox.schema)

    async def claim(self, jobs: dict[Item, PushJob]) -> Claimed:
        """Step 1: claim jobs, write or lease their targets; commit before any send."""
        if not jobs:
            return Claimed(sends=[], verdicts={}, jobs=[])
        started = time.monotonic()  # the leases start later: on PostgreSQL's BEGIN
        items = list(jobs)
        sends: list[Send] = []
        verdicts: Verdicts = {}
        progress: list[JobProgress] = []
        expiry = None
        lease_seconds = self.push.lease_seconds
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
                    first = min(len(job.targets), CHUNK_TARGETS)
                    taken = len(job.targets) - first
                    new = JobProgress(item=item, job=job, takeable=taken, ids=ids_of(item, job))
                    intents += self._intents(new, sends, first)
                    progress.append(new)
            if intents:
                expiry = await self.ledger.open(conn, intents, lease_seconds, leased=CHUNK_TARGETS)
            rows = await self.ledger.take(
                conn,
                list(seen_before),
                lease_seconds,
                self.push.unknown_outcome,
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
            leased = [r.target.target_index for r in of_job if r.mine]
            if not leased:  # a duplicate, or every target waits on another worker
                continue
            job = jobs[item]
            again = JobProgress(
                item=item,
                job=job,
                takeable=takeable(of_job),
                waits=verdicts.get(item),
                ids=ids_of(item, job),  # derived only for a job with sends of ours
            )
            sends += [new_send(self.provider, again, index) for index in leased]
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

    def _intents(self, new: JobProgress, sends: list[Send], first: int) -> list[SendIntent]:
        """Every target of a new job, with the ids each attempt will carry; the sends of
        its `first` targets (leased now) appended to `sends`, with the same ids."""
        assert new.item.envelope is not None
        key = new.item.envelope.key
        intents = []
        for index, device in enumerate(new.job.targets):
            device_ids = new.ids.for_token(device.token)
            intents.append(
                SendIntent(
                    target=TargetKey(key=key, target_index=index),
                    platform=str(device.platform),
                    token=device.token,
                    apns_id=device_ids.apns_id,
                    collapse_id=device_ids.collapse_id,
                )
            )
            if index < first:
                sends.append(new_send(self.provider, new, index, device_ids))
        return intents

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


def ids_of(item: Item, job: PushJob) -> JobIds:
    """The ids every push of a job shares, derived once per job (`JobProgress.ids`)."""
    assert item.envelope is not None
    return job_ids(dedupe_key_text(item.envelope.key), collapse_key=job.collapse_key)


def new_send(
    provider: Provider, progress: JobProgress, index: int, ids: SendIds | None = None
) -> Send:
    """The send of a job's target `index` (`ids`: its device's, when derived already)."""
    item, device = progress.item, progress.job.targets[index]
    assert item.envelope is not None
    return Send(
        item=item,
        job=progress.job,
        target=TargetKey(key=item.envelope.key, target_index=index),
        device=device,
        ids=ids if ids is not None else progress.ids.for_token(device.token),
        provider=provider_name(provider, device),
    )
