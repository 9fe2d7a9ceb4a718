"""Everything the database knows about one dedupe key, for `idempotent-workers inspect`.

Read-only and one key at a time, by primary key (claim, ledger) or by the
outbox's (queue, tenant, message_id) columns: the claim (when, fingerprint),
the send ledger's rows with their provider ids, and the outbox rows that
publish a message with this key to this queue, when the schema has an
outbox table (found by a scan of it: no index serves that lookup).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass

from dedupe.connection import DbConnection
from dedupe.inbox import DedupeKey
from dedupe.migrate import quote_ident


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRow:
    processed_at: datetime.datetime
    fingerprint: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRecord:
    key: DedupeKey
    claim: ClaimRow | None
    sends: list[Mapping[str, object]]  # outbound_sends rows, as read, by target
    outbox: list[Mapping[str, object]] | None  # as read; None: the schema has no outbox table

    @property
    def found(self) -> bool:
        return self.claim is not None or bool(self.sends) or bool(self.outbox)


_SENDS = (
    "target_index, platform, token, status, sends, provider_message_id, failure_reason,"
    " apns_id, collapse_id, lease_owner, lease_expires_at, created_at, updated_at"
)
_OUTBOX = "id, created_at, available_at, attempts, last_error, published_at"


async def look_up(conn: DbConnection, schema: str, key: DedupeKey) -> KeyRecord:
    q = quote_ident(schema)
    args = (key.consumer, key.tenant, key.message_id)
    claim = await conn.fetchrow(
        f"SELECT processed_at, fingerprint FROM {q}.processed_messages"
        " WHERE consumer = $1 AND tenant = $2 AND message_id = $3",
        *args,
    )
    sends = await conn.fetch(
        f"SELECT {_SENDS} FROM {q}.outbound_sends"
        " WHERE consumer = $1 AND tenant = $2 AND message_id = $3 ORDER BY target_index",
        *args,
    )
    outbox: list[Mapping[str, object]] | None = None
    if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{q}.outbox"):
        rows = await conn.fetch(
            f"SELECT {_OUTBOX} FROM {q}.outbox"
            " WHERE queue = $1 AND tenant = $2 AND message_id = $3 ORDER BY id",
            *args,
        )
        outbox = [dict(row) for row in rows]
    return KeyRecord(
        key=key,
        claim=None
        if claim is None
        else ClaimRow(processed_at=claim["processed_at"], fingerprint=bytes(claim["fingerprint"])),
        sends=[dict(row) for row in sends],
        outbox=outbox,
    )
