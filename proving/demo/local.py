"""The demo's local part: order jobs with duplicates and bad input, and what became of them.

Everything here is read back from PostgreSQL (the effect table, the outbox,
the send ledger) and RabbitMQ (the dead-letter queue), never from the
workers' own counters.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, replace

import aio_pika

from consumers import REASON_HEADER, dead_letter_queue
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from proving.demo.app import QUEUE

TENANTS = ("acme", "globex", "initech")


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    message_id: str | None
    body: bytes
    tenant: str
    kind: str  # original | duplicate | reused | malformed

    def message(self) -> aio_pika.Message:
        return aio_pika.Message(
            self.body,
            message_id=self.message_id,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={"x-tenant": self.tenant} if self.tenant else None,
        )


def plan_jobs(total: int, rng: random.Random) -> list[Job]:
    """`total` publishes: 10% exact duplicates, 1% reused ids, 1% malformed."""
    duplicates = total // 10
    reused = total // 100
    malformed = total // 100
    originals = total - duplicates - reused - malformed
    jobs = []
    for n in range(originals):
        body = {"order_id": n, "carrier": rng.choice(["ups", "dhl", "fedex"]), "items": n % 7 + 1}
        jobs.append(
            Job(
                message_id=f"order-{n}-shipped",
                body=_json(body),
                tenant=TENANTS[n % len(TENANTS)],
                kind="original",
            )
        )
    for _ in range(duplicates):
        jobs.append(replace(rng.choice(jobs[:originals]), kind="duplicate"))
    for source in rng.sample(jobs[:originals], reused):
        body = json.loads(source.body)
        body["carrier"] = "reused-for-another-order"
        jobs.append(replace(source, body=_json(body), kind="reused"))
    bad_bodies = [b"{not json", b"[1, 2, 3]", b'{"order_id": NaN}']
    for n in range(malformed):
        if n % 4 == 3:
            jobs.append(
                Job(
                    message_id=f"{n:04d}" + "x" * 200,
                    body=b'{"order_id": 1}',
                    tenant="",
                    kind="malformed",
                )
            )
        else:
            jobs.append(
                Job(
                    message_id=f"malformed-{n}", body=bad_bodies[n % 3], tenant="", kind="malformed"
                )
            )
    rng.shuffle(jobs)
    return jobs


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def order_of(job: Job) -> int:
    order: int = json.loads(job.body)["order_id"]
    return order


async def read_dead_letters(url: str) -> Counter[tuple[str, str]]:
    """(reason, message_id) of every dead letter, taken off the demo's DLQ."""
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    found: Counter[tuple[str, str]] = Counter()
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        dlq = await channel.get_queue(dead_letter_queue(QUEUE), ensure=True)
        while (message := await dlq.get(no_ack=True, fail=False, timeout=ANSWER_S)) is not None:
            reason = str((message.headers or {}).get(REASON_HEADER, "broker"))
            found[(reason, message.message_id or "")] += 1
    finally:
        await connection.close()
    return found


async def dead_letters_ready(url: str) -> int:
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel())
        queue = await channel.declare_queue(
            dead_letter_queue(QUEUE), passive=True, timeout=ANSWER_S
        )
        return queue.declaration_result.message_count or 0
    finally:
        await connection.close()


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxReport:
    expected: int  # follow-ups the plan's orders should emit, once each
    enqueued: int  # outbox rows: one per committed effect that emits
    published: int  # of them marked published by a relay (after the broker's confirm)
    emitted: int  # follow-ups that reached the push handler and were settled in the ledger
    lost: int  # expected follow-ups with no settled push

    @property
    def ok(self) -> bool:
        return self.enqueued == self.published == self.emitted == self.expected

    def line(self) -> str:
        return (
            f"outbox: enqueued={self.enqueued} published={self.published} "
            f"emitted={self.emitted} lost={self.lost}"
        )


async def outbox_report(db: DbConnection, follow_ups: set[str]) -> OutboxReport:
    """The push follow-ups, from the outbox table and the send ledger."""
    settled = {
        r["message_id"]
        for r in await db.fetch(
            "SELECT DISTINCT message_id FROM send_ledger"
            " WHERE message_id LIKE '%:push' AND status IN ('sent', 'failed')",
            timeout=ANSWER_S,
        )
    }
    return OutboxReport(
        expected=len(follow_ups),
        # The follow-ups' rows; the send API's jobs share the table (the ingress line counts those).
        enqueued=await db.fetchval(
            "SELECT count(*) FROM outbox WHERE message_id LIKE '%:push'", timeout=ANSWER_S
        ),
        published=await db.fetchval(
            "SELECT count(*) FROM outbox"
            " WHERE message_id LIKE '%:push' AND published_at IS NOT NULL",
            timeout=ANSWER_S,
        ),
        emitted=len(settled & follow_ups),
        lost=len(follow_ups - settled),
    )
