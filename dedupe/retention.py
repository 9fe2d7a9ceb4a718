"""Retention: delete dedupe rows older than the longest redelivery window.

A processed_messages row must outlive every copy of its message: a copy
redelivered after its row is gone would run again. The default, 7 days, is
far beyond any broker redelivery or delay tier; choose longer if publishers
retry for longer. Rows go in bounded batches (one short transaction each), so
cleanup never holds locks for long, and a push job whose sends are not all
`sent` or `failed` keeps its claim and its ledger rows until they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from dedupe.connection import DbConnection
from dedupe.migrate import quote_ident


@dataclass(frozen=True, slots=True, kw_only=True)
class Retention:
    keep: timedelta = timedelta(days=7)
    batch_size: int = 5_000

    def __post_init__(self) -> None:
        if self.keep <= timedelta(0):
            raise ValueError("retention must keep rows for a positive time")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class CleanupResult:
    processed_messages: int
    outbound_sends: int


async def cleanup(
    conn: DbConnection,
    schema: str = "public",
    retention: Retention | None = None,
    progress: Callable[[CleanupResult], None] | None = None,
) -> CleanupResult:
    """Delete expired rows batch by batch until none is left; return the counts."""
    retention = retention or Retention()
    q = quote_ident(schema)
    sends = 0
    claims = 0
    delete_sends = (
        f"DELETE FROM {q}.outbound_sends WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.outbound_sends"
        "  WHERE created_at < now() - $1::interval AND status IN ('sent', 'failed')"
        "  LIMIT $2))"
    )
    delete_claims = (
        f"DELETE FROM {q}.processed_messages p WHERE ctid = ANY(ARRAY("
        f" SELECT ctid FROM {q}.processed_messages p"
        "  WHERE processed_at < now() - $1::interval"
        f"  AND NOT EXISTS (SELECT 1 FROM {q}.outbound_sends o"
        "   WHERE (o.consumer, o.tenant, o.message_id) = (p.consumer, p.tenant, p.message_id))"
        "  LIMIT $2))"
    )
    for sql, is_sends in ((delete_sends, True), (delete_claims, False)):
        while True:
            status = await conn.execute(sql, retention.keep, retention.batch_size)
            deleted = int(status.split()[-1])
            if is_sends:
                sends += deleted
            else:
                claims += deleted
            if progress is not None:
                progress(CleanupResult(processed_messages=claims, outbound_sends=sends))
            if deleted < retention.batch_size:
                break
    return CleanupResult(processed_messages=claims, outbound_sends=sends)
