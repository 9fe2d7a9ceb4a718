"""The outbox: messages to publish, written in the caller's transaction.

"The effect is a row, not a call": `Outbox.enqueue(tx, ...)` inserts the
message into the `outbox` table inside the caller's own transaction, so the
message exists if and only if the caller's effects committed. A relay
(`consumers.publishing.relay`) publishes it later, with publisher confirms, and marks it
published. The statements here are the relay's too:

- `claim(tx, limit)`: pending rows, oldest first, `FOR UPDATE SKIP LOCKED`,
  so several relays share the rows and never hold the same one; the locks
  last as long as the relay's transaction;
- `mark_published(tx, rows)` and `postpone(tx, failures)`: what became of
  them, committed with the claim's transaction.

There is no `id > last_seen` cursor anywhere: ids are handed out at INSERT and
committed in another order, so a cursor would skip the rows of a transaction
that commits late. Every claim asks again for whatever is pending.

An insert wakes the relays through `NOTIFY idempotent_workers_outbox` (a
trigger; the payload is the schema), delivered when the transaction commits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dedupe.connection import DbConnection
from dedupe.errors import NotInTransaction
from dedupe.generations import OUTBOX, current_sql
from dedupe.migrate import quote_ident

NOTIFY_CHANNEL = "idempotent_workers_outbox"
MAX_MESSAGE_ID_BYTES = 128  # as the message contract (and the table's CHECK) says


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRow:
    """A pending message as the relay claimed it."""

    id: int
    queue: str
    tenant: str
    message_id: str
    headers: Mapping[str, str]
    body: bytes
    attempts: int
    generation: int = 0  # the outbox's generation it is in (dedupe.generations)


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishFailure:
    """A claimed row the relay could not publish: tried again after `retry_after_s`."""

    id: int
    error: str
    retry_after_s: float


def encode_body(body: Mapping[str, Any] | bytes) -> bytes:
    """The bytes published: raw bytes as they are, a mapping as compact JSON."""
    if isinstance(body, bytes):
        return body
    return json.dumps(body, separators=(",", ":")).encode()


class Outbox:
    """The `outbox` table of one schema."""

    __slots__ = ("_claim", "_insert", "_mark", "_postpone", "insert_sql", "schema")

    def __init__(self, schema: str = "public") -> None:
        self.schema = schema
        table = f"{quote_ident(schema)}.outbox"
        columns = "queue, tenant, message_id, headers, body"
        self.insert_sql = (
            f"INSERT INTO {table} (generation, {columns})"
            f" VALUES ({current_sql(schema, OUTBOX)}, $1, $2, $3, $4, $5)"
        )
        """One row's INSERT, for `executemany` with the arguments of `row_args`."""
        self._insert = f"{self.insert_sql} RETURNING id"
        self._claim = (
            f"SELECT id, {columns}, attempts, generation FROM {table}"
            " WHERE published_at IS NULL AND available_at <= now()"
            " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
        )
        # clock_timestamp(), not now(): when the confirms were in, not when the claim began.
        # The rows' generations: one primary key probed a row, not every generation's.
        self._mark = (
            f"UPDATE {table} SET published_at = clock_timestamp()"
            " WHERE generation = ANY($2::int[]) AND id = ANY($1::bigint[])"
        )
        self._postpone = (
            f"UPDATE {table} o SET attempts = o.attempts + 1, last_error = f.error,"
            " available_at = now() + f.delay * interval '1 second'"
            " FROM unnest($1::bigint[], $2::text[], $3::float8[]) AS f(id, error, delay)"
            " WHERE o.id = f.id"
        )

    @staticmethod
    def row_args(
        *,
        queue: str,
        body: Mapping[str, Any] | bytes,
        message_id: str,
        tenant: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> tuple[str, str, str, str | None, bytes]:
        """The arguments of `insert_sql` for one message; raises ValueError on bad input."""
        if not message_id or len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
            raise ValueError(f"message_id must be 1 to {MAX_MESSAGE_ID_BYTES} bytes")
        if not queue:
            raise ValueError("queue must not be empty")
        encoded_headers = json.dumps(dict(headers), separators=(",", ":")) if headers else None
        return (queue, tenant, message_id, encoded_headers, encode_body(body))

    async def enqueue(
        self,
        tx: DbConnection,
        *,
        queue: str,
        body: Mapping[str, Any] | bytes,
        message_id: str,
        tenant: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Write one message to publish in `tx`'s transaction; return its row id.

        `tx` must be inside a transaction (raises `NotInTransaction`
        otherwise): outside one, the row would commit at once, whatever
        becomes of the caller's effects.
        """
        args = self.row_args(
            queue=queue, body=body, message_id=message_id, tenant=tenant, headers=headers
        )
        if not tx.is_in_transaction():
            raise NotInTransaction("Outbox.enqueue needs the caller's open transaction")
        row_id: int = await tx.fetchval(self._insert, *args)
        return row_id

    async def claim(self, tx: DbConnection, limit: int) -> list[OutboxRow]:
        """Lock up to `limit` pending rows nobody else holds, oldest first."""
        rows = await tx.fetch(self._claim, limit)
        return [
            OutboxRow(
                id=r[0],
                queue=r[1],
                tenant=r[2],
                message_id=r[3],
                headers=json.loads(r[4]) if r[4] is not None else {},
                body=bytes(r[5]),
                attempts=r[6],
                generation=r[7],
            )
            for r in rows
        ]

    async def mark_published(self, tx: DbConnection, rows: Sequence[OutboxRow]) -> None:
        if rows:
            await tx.execute(self._mark, [r.id for r in rows], sorted({r.generation for r in rows}))

    async def postpone(self, tx: DbConnection, failures: Sequence[PublishFailure]) -> None:
        """Leave rows pending, not to be claimed again before their delay."""
        if failures:
            await tx.execute(
                self._postpone,
                [f.id for f in failures],
                [f.error for f in failures],
                [f.retry_after_s for f in failures],
            )

    async def pending(self, conn: DbConnection) -> int:
        """How many rows are not yet published (for reports and tests)."""
        count: int = await conn.fetchval(
            f"SELECT count(*) FROM {quote_ident(self.schema)}.outbox WHERE published_at IS NULL"
        )
        return count
