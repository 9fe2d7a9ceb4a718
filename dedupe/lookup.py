"""Everything the database knows about one dedupe key, for `inspect` and the console.

Read-only and one key at a time, by primary key (claim, ledger) or by the
outbox's (queue, tenant, message_id) columns: the claim (when, fingerprint),
the send ledger's rows with their provider ids, and the outbox rows that
publish a message with this key to this queue, when the schema has an
outbox table (found by a scan of it: no index serves that lookup). A push
job the send API made (`ingress-<uuid>`) also has the API's message row (by
primary key) and its idempotency key row (by a scan: no index on message_id).

`claims()` answers, for many keys of one consumer at once, which are claimed:
what a replay's dry run asks before it says "a replay would be a no-op".
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dedupe.connection import DbConnection
from dedupe.inbox import DedupeKey
from dedupe.messages import JOB_PREFIX
from dedupe.migrate import quote_ident


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRow:
    processed_at: datetime.datetime
    fingerprint: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRecord:
    key: DedupeKey
    claim: ClaimRow | None
    sends: list[Mapping[str, object]]  # send_ledger rows, as read, by target
    outbox: list[Mapping[str, object]] | None  # as read; None: the schema has no outbox table
    api_message: Mapping[str, object] | None = None  # ingress_messages, for an `ingress-` job
    api_key: Mapping[str, object] | None = None  # ingress_idempotency_keys, the same

    @property
    def found(self) -> bool:
        return self.claim is not None or bool(self.sends) or bool(self.outbox)


_SENDS = (
    "target_index, channel, address, status, sends, provider_message_id, failure_reason,"
    " effect_id, collapse_id, first_sent_at, lease_owner, lease_expires_at, created_at, updated_at"
)
_OUTBOX = "id, created_at, available_at, attempts, last_error, published_at"
_API_MESSAGE = "id, tenant, queue, targets, status, created_at, updated_at"
_API_KEY = "tenant, idempotency_key, message_id, created_at"


async def look_up(conn: DbConnection, schema: str, key: DedupeKey) -> KeyRecord:
    q = quote_ident(schema)
    args = (key.consumer, key.tenant, key.message_id)
    claim = await conn.fetchrow(
        f"SELECT processed_at, fingerprint FROM {q}.processed_messages"
        " WHERE consumer = $1 AND tenant = $2 AND message_id = $3",
        *args,
    )
    sends = await conn.fetch(
        f"SELECT {_SENDS} FROM {q}.send_ledger"
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
    api_message, api_key = await _api_rows(conn, q, key)
    return KeyRecord(
        key=key,
        claim=None
        if claim is None
        else ClaimRow(processed_at=claim["processed_at"], fingerprint=bytes(claim["fingerprint"])),
        sends=[dict(row) for row in sends],
        outbox=outbox,
        api_message=api_message,
        api_key=api_key,
    )


async def _api_rows(
    conn: DbConnection, q: str, key: DedupeKey
) -> tuple[Mapping[str, object] | None, Mapping[str, object] | None]:
    """The send API's message and idempotency key rows of an `ingress-<uuid>` job."""
    if not key.message_id.startswith(JOB_PREFIX):
        return None, None
    try:
        message = uuid.UUID(key.message_id.removeprefix(JOB_PREFIX))
    except ValueError:
        return None, None
    if not await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{q}.ingress_messages"):
        return None, None
    row = await conn.fetchrow(
        f"SELECT {_API_MESSAGE} FROM {q}.ingress_messages WHERE id = $1 AND tenant = $2",
        message,
        key.tenant,
    )
    if row is None:
        return None, None
    api_key = await conn.fetchrow(
        f"SELECT {_API_KEY} FROM {q}.ingress_idempotency_keys"
        " WHERE tenant = $1 AND message_id = $2",
        key.tenant,
        message,
    )
    return dict(row), None if api_key is None else dict(api_key)


async def claims(
    conn: DbConnection, schema: str, consumer: str, keys: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], ClaimRow]:
    """The claims of `consumer` among `keys` (tenant, message_id), by primary key, in one query."""
    if not keys:
        return {}
    rows = await conn.fetch(
        "SELECT p.tenant, p.message_id, p.processed_at, p.fingerprint"
        " FROM unnest($2::text[], $3::text[]) AS k(tenant, message_id)"
        f" JOIN {quote_ident(schema)}.processed_messages p"
        "  ON p.consumer = $1 AND p.tenant = k.tenant AND p.message_id = k.message_id",
        consumer,
        [tenant for tenant, _ in keys],
        [message_id for _, message_id in keys],
    )
    return {
        (row[0], row[1]): ClaimRow(processed_at=row[2], fingerprint=bytes(row[3])) for row in rows
    }
