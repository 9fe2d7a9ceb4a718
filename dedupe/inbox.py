"""The inbox: claim dedupe keys inside the caller's transaction.

`Inbox.claim()` takes every key of a batch and answers, for each, whether it is
new (this transaction now owns it), a duplicate (claimed before with the same
fingerprint) or reused (claimed before with another fingerprint: the client
reused a message_id for a new intent).

`processed_messages` is kept in generations (`dedupe.generations`): one
statement, `claim_messages()` (migration 0012), claims the whole batch: it
holds the rotation lock shared until our transaction ends, looks every key
up in the older live generations and inserts the others into the current
one (ON CONFLICT DO NOTHING), keys in sorted order so that two batches
sharing keys lock them in the same order and cannot deadlock. The current
generation's unique index decides races between workers: a second claimant
waits on the index until the first commits, then sees the conflict; no
rotation can fall between two claims of one key that both miss each other
(`dedupe.generations`, 1. and 3.). Only when some key was not inserted does a
second statement read the stored fingerprints, across the generations; it
runs in a fresh snapshot, so it sees rows committed while we waited.

A key found claimed may be a commit the primary kept after its wait for the
synchronous standby was cancelled (`dedupe.replication`): visible here, not
yet on the standby. PostgreSQL's COMMIT waits for a standby only when the
transaction wrote WAL (xact.c, RecordTransactionCommit): a batch of
duplicates alone writes none, and would be acknowledged on a claim a failover
loses. So the second statement locks the rows it reads (FOR KEY SHARE, one
WAL record each): the COMMIT then returns only once the standby has
everything before it, the first claim included. A duplicate is acknowledged
on a replicated claim, never on a local one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from dedupe.connection import DbConnection
from dedupe.generations import PROCESSED_MESSAGES, current_sql
from dedupe.migrate import quote_ident


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class DedupeKey:
    """(consumer, tenant, message_id): the identity of one event for one consumer."""

    consumer: str
    tenant: str
    message_id: str


class ClaimOutcome(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    REUSED = "reused"


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    key: DedupeKey
    fingerprint: bytes


class Inbox:
    """The `processed_messages` table of one schema."""

    __slots__ = ("_insert", "_select", "schema")

    def __init__(self, schema: str = "public") -> None:
        self.schema = schema
        table = f"{quote_ident(schema)}.processed_messages"
        self._insert = (
            f"SELECT * FROM {quote_ident(schema)}.claim_messages("
            "$1::text[], $2::text[], $3::text[], $4::bytea[])"
        )
        self._select = (
            f"SELECT p.consumer, p.tenant, p.message_id, p.fingerprint FROM {table} p"
            " JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(consumer, tenant, message_id)"
            " USING (consumer, tenant, message_id)"
            " FOR KEY SHARE OF p"  # WAL written: the COMMIT waits for the standby
        )

    async def claim(self, tx: DbConnection, claims: Sequence[Claim]) -> list[ClaimOutcome]:
        """Claim every key in one statement; return an outcome per claim, in order.

        Keys must be distinct within one call (the caller folds in-batch
        repeats). Must run inside a transaction: the claims commit or roll back
        with the caller's effects.
        """
        if not claims:
            return []
        # The DedupeKey order, as a plain tuple: comparing the dataclasses
        # builds two tuples per comparison (measured: 3.2 us a key, not 0.7).
        ordered = sorted(claims, key=lambda c: (c.key.consumer, c.key.tenant, c.key.message_id))
        inserted = await tx.fetch(
            self._insert,
            [c.key.consumer for c in ordered],
            [c.key.tenant for c in ordered],
            [c.key.message_id for c in ordered],
            [c.fingerprint for c in ordered],
        )
        if len(inserted) == len(claims):
            return [ClaimOutcome.NEW] * len(claims)
        won = {DedupeKey(consumer=r[0], tenant=r[1], message_id=r[2]) for r in inserted}
        lost = [c.key for c in ordered if c.key not in won]
        stored = {
            DedupeKey(consumer=r[0], tenant=r[1], message_id=r[2]): bytes(r[3])
            for r in await tx.fetch(
                self._select,
                [k.consumer for k in lost],
                [k.tenant for k in lost],
                [k.message_id for k in lost],
            )
        }
        outcomes = []
        for c in claims:
            if c.key in won:
                outcomes.append(ClaimOutcome.NEW)
            elif stored.get(c.key, c.fingerprint) == c.fingerprint:
                # A generation dropped by retention between the two statements
                # reads as a duplicate: it was processed once, long ago.
                outcomes.append(ClaimOutcome.DUPLICATE)
            else:
                outcomes.append(ClaimOutcome.REUSED)
        return outcomes

    async def release(self, tx: DbConnection, keys: Sequence[DedupeKey]) -> None:
        """Drop claims made in this transaction (a message whose handler failed).

        They are in the current generation: the transaction holds the rotation
        lock shared since its claim, so no other generation became current.
        """
        if not keys:
            return
        q = quote_ident(self.schema)
        await tx.execute(
            f"DELETE FROM {q}.processed_messages p"
            " USING unnest($1::text[], $2::text[], $3::text[]) AS k(consumer, tenant, message_id)"
            " WHERE (p.consumer, p.tenant, p.message_id) = (k.consumer, k.tenant, k.message_id)"
            f" AND p.generation = {current_sql(self.schema, PROCESSED_MESSAGES)}",
            [k.consumer for k in keys],
            [k.tenant for k in keys],
            [k.message_id for k in keys],
        )
