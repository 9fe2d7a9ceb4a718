"""The HTTP send API's tables: idempotency keys and messages, in the caller's transaction.

`Messages.accept()` takes the requests of one commit (concurrent requests
share it) and answers each: `queued` with a new id, `duplicate_ignored` with
the first id, or `idempotency_key_reused`:

1. one INSERT ... ON CONFLICT DO NOTHING writes the keys, sorted, so two
   commits sharing keys lock them in one order and cannot deadlock. The
   primary key decides a race: the second writer waits until the first
   commits, then sees the conflict;
2. the winners' message rows, `queued`, in one INSERT;
3. only if some key conflicted, one SELECT (a fresh snapshot, so it sees the
   row committed while we waited) reads the stored fingerprints and ids.

The caller adds the outbox row of each new message before it commits, so a
key never exists without its message and its job.

A message is `queued` until a push worker takes it; `take()` (the worker's
claim transaction) and `cancel()` are compare-and-sets from `queued`, so of a
cancel and a send starting at once exactly one wins.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from dedupe.connection import DbConnection
from dedupe.errors import KeyVanished
from dedupe.migrate import quote_ident
from dedupe.transition import Transition, transition

# The AMQP header naming the ingress message a push job was sent for.
INGRESS_HEADER = "x-ingress-message"


class MessageStatus(StrEnum):
    QUEUED = "queued"
    TAKEN = "taken"  # a push worker started sending it: too late to cancel
    CANCELLED = "cancelled"


class Acceptance(StrEnum):
    QUEUED = "queued"
    DUPLICATE_IGNORED = "duplicate_ignored"
    KEY_REUSED = "idempotency_key_reused"


@dataclass(frozen=True, slots=True, kw_only=True)
class NewMessage:
    tenant: str
    idempotency_key: str
    fingerprint: bytes  # of the canonical body, the key field left out
    queue: str
    targets: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    outcome: Acceptance
    id: uuid.UUID | None  # None only for KEY_REUSED


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetState:
    index: int
    status: str  # `pending` until the worker writes the ledger row, then the ledger's
    platform: str | None = None
    provider_message_id: str | None = None
    failure_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageView:
    id: uuid.UUID
    status: MessageStatus
    created_at: datetime
    updated_at: datetime
    targets: tuple[TargetState, ...]


def job_message_id(message: uuid.UUID) -> str:
    """The AMQP message_id (the push worker's dedupe key) of an ingress message's job."""
    return f"ingress-{message}"


def parse_message_id(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


class Messages:
    """The ingress tables of one schema."""

    def __init__(self, schema: str = "public") -> None:
        q = quote_ident(schema)
        self.schema = schema
        self._keys = f"{q}.ingress_idempotency_keys"
        self._messages = f"{q}.ingress_messages"
        self._sends = f"{q}.outbound_sends"

    async def accept(self, tx: DbConnection, requests: Sequence[NewMessage]) -> list[Accepted]:
        """Answer every request, in order; must run inside the caller's transaction."""
        first: dict[tuple[str, str], NewMessage] = {}
        for r in requests:  # a key twice in one commit: the first one stands for both
            first.setdefault((r.tenant, r.idempotency_key), r)
        ordered = sorted(first.items())
        ids = {k: uuid.uuid4() for k, _ in ordered}
        won = {
            (row[0], row[1])
            for row in await tx.fetch(
                f"INSERT INTO {self._keys} (tenant, idempotency_key, fingerprint, message_id)"
                " SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[])"
                " ON CONFLICT DO NOTHING RETURNING tenant, idempotency_key",
                [k[0] for k, _ in ordered],
                [k[1] for k, _ in ordered],
                [r.fingerprint for _, r in ordered],
                [ids[k] for k, _ in ordered],
            )
        }
        if won:
            new = [(k, r) for k, r in ordered if k in won]
            await tx.execute(
                f"INSERT INTO {self._messages} (id, tenant, queue, targets, status)"
                " SELECT i, t, q, n, 'queued'"
                " FROM unnest($1::uuid[], $2::text[], $3::text[], $4::int[]) AS x(i, t, q, n)",
                [ids[k] for k, _ in new],
                [r.tenant for _, r in new],
                [r.queue for _, r in new],
                [r.targets for _, r in new],
            )
        stored = {k: (r.fingerprint, ids[k]) for k, r in ordered if k in won}
        lost = [k for k, _ in ordered if k not in won]
        if lost:
            for row in await tx.fetch(
                f"SELECT k.tenant, k.idempotency_key, k.fingerprint, k.message_id"
                f" FROM {self._keys} k JOIN unnest($1::text[], $2::text[]) AS x(t, ik)"
                " ON (k.tenant, k.idempotency_key) = (x.t, x.ik)",
                [k[0] for k in lost],
                [k[1] for k in lost],
            ):
                stored[(row[0], row[1])] = (bytes(row[2]), row[3])
        answers = []
        for r in requests:
            key = (r.tenant, r.idempotency_key)
            if key not in stored:
                raise KeyVanished(f"idempotency key {r.idempotency_key!r} vanished: try again")
            fingerprint, message = stored[key]
            if r is first[key] and key in won:
                answers.append(Accepted(outcome=Acceptance.QUEUED, id=message))
            elif fingerprint == r.fingerprint:
                answers.append(Accepted(outcome=Acceptance.DUPLICATE_IGNORED, id=message))
            else:
                answers.append(Accepted(outcome=Acceptance.KEY_REUSED, id=None))
        return answers

    async def find(self, conn: DbConnection, tenant: str, message: uuid.UUID) -> MessageView | None:
        """The message and its targets' ledger states; None if it is not this tenant's."""
        row = await conn.fetchrow(
            f"SELECT queue, targets, status, created_at, updated_at FROM {self._messages}"
            " WHERE id = $1 AND tenant = $2",
            message,
            tenant,
        )
        if row is None:
            return None
        sends = {
            r[0]: TargetState(
                index=r[0],
                status=r[1],
                platform=r[2],
                provider_message_id=r[3],
                failure_reason=r[4],
            )
            for r in await conn.fetch(
                "SELECT target_index, status, platform, provider_message_id, failure_reason"
                f" FROM {self._sends}"
                " WHERE consumer = $1 AND tenant = $2 AND message_id = $3 ORDER BY target_index",
                row[0],
                tenant,
                job_message_id(message),
            )
        }
        return MessageView(
            id=message,
            status=MessageStatus(row[2]),
            created_at=row[3],
            updated_at=row[4],
            targets=tuple(
                sends.get(n, TargetState(index=n, status="pending")) for n in range(row[1])
            ),
        )

    async def cancel(self, tx: DbConnection, tenant: str, message: uuid.UUID) -> Transition:
        """queued -> cancelled, a compare-and-set; the loser learns the status that beat it."""
        return await transition(
            tx,
            "ingress_messages",
            {"id": message, "tenant": tenant},
            expected=MessageStatus.QUEUED,
            to=MessageStatus.CANCELLED,
            schema=self.schema,
            touch="updated_at",
        )

    async def take(self, tx: DbConnection, messages: Sequence[uuid.UUID]) -> set[uuid.UUID]:
        """queued -> taken for a push worker's new jobs; return the ones cancelled instead.

        The same compare-and-set as `cancel()`: whichever commits first wins.
        A message not found (retention) is not cancelled: it is sent.
        """
        if not messages:
            return set()
        wanted = sorted(set(messages))
        taken = {
            r[0]
            for r in await tx.fetch(
                f"UPDATE {self._messages} SET status = 'taken', updated_at = now()"
                " WHERE id = ANY($1::uuid[]) AND status = 'queued' RETURNING id",
                wanted,
            )
        }
        if len(taken) == len(wanted):
            return set()
        rows = await tx.fetch(
            f"SELECT id FROM {self._messages} WHERE id = ANY($1::uuid[]) AND status = 'cancelled'",
            [m for m in wanted if m not in taken],
        )
        return {r[0] for r in rows}
