"""The HTTP send API's tables: idempotency keys and messages, in the caller's transaction.

`Messages.accept()` takes the requests of one commit (concurrent requests
share it) and answers each: `queued` with a new id, `duplicate_ignored` with
the first id, or `idempotency_key_reused`. One statement, one round trip,
and when it runs outside a transaction its own commit:

1. the keys, sorted (two commits sharing keys lock them in one order and
   cannot deadlock), each looked up in the older generations of the keys
   (`dedupe.generations`: the statement holds the rotation lock shared) and
   the others INSERT ... ON CONFLICT DO NOTHING into the current one. Its
   primary key decides a race: the second writer waits until the first
   commits, then sees the conflict;
2. for each key written, its message row (`queued`) and its outbox row (the
   push job, message_id derived from the message id, the ingress header
   naming the message), in the same statement, so a key never exists without
   its message and its job;
3. for each key that conflicted, the stored fingerprint and id as the
   statement's snapshot saw them.

A key that conflicted with a writer that committed after that snapshot is
not seen by step 3: one more SELECT (a fresh snapshot) reads it. A key gone
even then (retention dropped its generation in between) is tried again from
step 1.

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
JOB_PREFIX = "ingress-"  # of the job's message_id: the prefix, then the message id
_VANISHED_TRIES = 3


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
    job: bytes  # the push job as published: JSON, the key field left out
    # A send of more than PART_TARGETS devices: its parts' bodies, in order, published
    # as `<job id>#0`, `#1`, ... (`part_message_ids`) instead of `job`, to `parts_queue`
    # (the queue's bulk lane) if given, else to `queue`.
    parts: tuple[bytes, ...] = ()
    parts_queue: str | None = None
    # W3C trace context the outbox rows keep (and the relay's publish continues):
    # the request's span when tracing is on, else None.
    traceparent: str | None = None
    tracestate: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Accepted:
    outcome: Acceptance
    id: uuid.UUID | None  # None only for KEY_REUSED


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetState:
    index: int
    status: str  # `pending` until the worker writes the ledger row, then the ledger's
    platform: str | None = None  # the ledger row's channel
    address: str | None = None  # the ledger row's: a device token, an endpoint's id
    provider_message_id: str | None = None
    failure_reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageView:
    id: uuid.UUID
    status: MessageStatus
    created_at: datetime
    updated_at: datetime
    targets: tuple[TargetState, ...]  # every device's, up to LISTED_TARGETS; else none
    sent: int = 0  # devices of every part, by their ledger rows
    failed: int = 0
    pending: int = 0  # neither yet: not claimed, claimed, or sending


LISTED_TARGETS = 1_000  # a message's view lists its devices one by one up to this many
PART_TARGETS = 200  # devices of one part of a send: 200 tokens of 4,096 characters fit 1 MiB
PART_SEPARATOR = "#"


def part_message_ids(parent: str, targets: int) -> list[str]:
    """The message_ids of a send of `targets` devices: its own if one part holds them,
    else `parent#0`, `parent#1`, ... one per PART_TARGETS devices, in target order."""
    parts = max(1, -(-targets // PART_TARGETS))
    if parts == 1:
        return [parent]
    return [f"{parent}{PART_SEPARATOR}{k}" for k in range(parts)]


def job_message_id(message: uuid.UUID) -> str:
    """The AMQP message_id (the push worker's dedupe key) of an ingress message's job."""
    return f"{JOB_PREFIX}{message}"


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
        self._sends = f"{q}.send_ledger"
        # One row per input row, in input order: (won, stored fingerprint, id): the new
        # id if won, else the stored fingerprint and id (NULL if the snapshot missed
        # them). The statement is accept_messages() (migrations 0012, 0021): the keys are
        # kept in generations (`dedupe.generations`), as the claims are.
        self._accept_sql = (
            f"SELECT * FROM {q}.accept_messages($1::text[], $2::text[], $3::bytea[],"
            " $4::text[], $5::int[], $6::bigint[], $7::text[], $8::bytea[],"
            f" $9::text[], $10::text[], '{JOB_PREFIX}', '{INGRESS_HEADER}', $11::text[])"
        )
        self._find_keys_sql = (
            "SELECT x.t, x.ik, k.fingerprint, k.message_id"
            " FROM unnest($1::text[], $2::text[]) AS x(t, ik)"
            f" JOIN LATERAL ({self._key_lookup('x.t', 'x.ik')} LIMIT 1 FOR KEY SHARE) k ON true"
        )

    def _key_lookup(self, tenant: str, key: str) -> str:
        """One key's row by its primary key, for a LATERAL join.

        One index probe per request, however the plan was made: the statements
        are prepared, and a generic plan made while the table was empty joined
        it by a sequential scan, which then cost every commit the whole table
        (LIMIT keeps the subquery from being merged into a plain join).
        Callers lock the row they read (FOR KEY SHARE): the WAL record makes
        the statement's commit wait for the synchronous standby, so a
        duplicate is answered only once the first request's rows are
        replicated (`dedupe.replication`).
        """
        return (
            f"SELECT fingerprint, message_id FROM {self._keys}"
            f" WHERE tenant = {tenant} AND idempotency_key = {key}"
        )

    async def accept(self, conn: DbConnection, requests: Sequence[NewMessage]) -> list[Accepted]:
        """Answer every request, in order, once its rows are committed.

        Outside a transaction the statement commits on its own; inside the
        caller's, the caller's COMMIT makes it durable.
        """
        first: dict[tuple[str, str], int] = {}  # key -> the position of its first request
        for n, r in enumerate(requests):  # a key twice in one commit: the first stands for both
            first.setdefault((r.tenant, r.idempotency_key), n)
        stored: dict[tuple[str, str], tuple[bytes, uuid.UUID]] = {}
        won: set[tuple[str, str]] = set()
        wanted = [(k, requests[n]) for k, n in sorted(first.items())]
        for _ in range(_VANISHED_TRIES):
            jobs = [
                (n, suffix, body) for n, (_, r) in enumerate(wanted, 1) for suffix, body in _jobs(r)
            ]
            rows = await conn.fetch(
                self._accept_sql,
                [k[0] for k, _ in wanted],
                [k[1] for k, _ in wanted],
                [r.fingerprint for _, r in wanted],
                [r.queue for _, r in wanted],
                [r.targets for _, r in wanted],
                [j[0] for j in jobs],
                [j[1] for j in jobs],
                [j[2] for j in jobs],
                [r.traceparent for _, r in wanted],
                [r.tracestate for _, r in wanted],
                [r.parts_queue or r.queue for _, r in wanted],
            )
            unseen = []
            for (key, r), row in zip(wanted, rows, strict=True):
                if row[0]:
                    won.add(key)
                    stored[key] = (r.fingerprint, row[2])
                elif row[1] is not None:
                    stored[key] = (bytes(row[1]), row[2])
                else:
                    unseen.append(key)
            if unseen:  # committed after the statement's snapshot: a fresh one sees them
                for row in await conn.fetch(
                    self._find_keys_sql, [k[0] for k in unseen], [k[1] for k in unseen]
                ):
                    stored[(row[0], row[1])] = (bytes(row[2]), row[3])
            wanted = [(k, requests[first[k]]) for k in unseen if k not in stored]
            if not wanted:
                break
        else:
            names = ", ".join(repr(k[1]) for k, _ in wanted)
            raise KeyVanished(f"idempotency keys {names} kept vanishing: try again")
        answers = []
        for n, r in enumerate(requests):
            key = (r.tenant, r.idempotency_key)
            fingerprint, message = stored[key]
            if first[key] == n and key in won:
                answers.append(Accepted(outcome=Acceptance.QUEUED, id=message))
            elif fingerprint == r.fingerprint:
                answers.append(Accepted(outcome=Acceptance.DUPLICATE_IGNORED, id=message))
            else:
                answers.append(Accepted(outcome=Acceptance.KEY_REUSED, id=None))
        return answers

    async def find(self, conn: DbConnection, tenant: str, message: uuid.UUID) -> MessageView | None:
        """The message, its devices counted (and listed, up to LISTED_TARGETS) across its
        parts by their ledger states; None if it is not this tenant's. Targets past the
        count stored at accept are the worker's choice (a webhook's endpoints, stored
        as 0): listed, and counted, as the ledger has them."""
        row = await conn.fetchrow(
            f"SELECT queue, targets, status, created_at, updated_at FROM {self._messages}"
            " WHERE id = $1 AND tenant = $2",
            message,
            tenant,
        )
        if row is None:
            return None
        ids = part_message_ids(job_message_id(message), row[1])
        where = f" FROM {self._sends} WHERE consumer = $1 AND tenant = $2 AND message_id = ANY($3)"
        counts = {
            r[0]: r[1]
            for r in await conn.fetch(
                f"SELECT status, count(*)::int{where} GROUP BY status", row[0], tenant, ids
            )
        }
        sent, failed = counts.get("sent", 0), counts.get("failed", 0)
        targets = max(row[1], sum(counts.values()))
        listed: tuple[TargetState, ...] = ()
        if targets <= LISTED_TARGETS:
            part = {part_id: k for k, part_id in enumerate(ids)}
            sends = {}
            for r in await conn.fetch(
                "SELECT message_id, target_index, status, channel, provider_message_id,"
                f" failure_reason, address{where}",
                row[0],
                tenant,
                ids,
            ):
                index = part[r[0]] * PART_TARGETS + r[1]
                sends[index] = TargetState(
                    index=index,
                    status=r[2],
                    platform=r[3],
                    address=r[6],
                    provider_message_id=r[4],
                    failure_reason=r[5],
                )
            listed = tuple(
                sends.get(n, TargetState(index=n, status="pending")) for n in range(targets)
            )
        return MessageView(
            id=message,
            status=MessageStatus(row[2]),
            created_at=row[3],
            updated_at=row[4],
            targets=listed,
            sent=sent,
            failed=failed,
            pending=targets - sent - failed,
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


def _jobs(message: NewMessage) -> list[tuple[str, bytes]]:
    """The outbox rows of a message: (the suffix of its job's message_id, the body)."""
    if not message.parts:
        return [("", message.job)]
    return [(f"{PART_SEPARATOR}{k}", body) for k, body in enumerate(message.parts)]
