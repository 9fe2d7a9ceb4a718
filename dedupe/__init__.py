"""The PostgreSQL side: migrations, the inbox of processed messages, the send ledger, the outbox."""

from dedupe.connection import DbConnection
from dedupe.errors import DedupeError, MigrationError, NotInTransaction, SchemaMissing
from dedupe.fingerprint import canonical_json, fingerprint, is_plain
from dedupe.inbox import Claim, ClaimOutcome, DedupeKey, Inbox
from dedupe.ledger import (
    LEASE_EXPIRED,
    SendIntent,
    SendLedger,
    SendResult,
    SendRow,
    SendStatus,
    TargetKey,
    UnknownOutcome,
)
from dedupe.lookup import ClaimRow, KeyRecord, look_up
from dedupe.migrate import available_migrations, check_schema, migrate, quote_ident
from dedupe.outbox import NOTIFY_CHANNEL, Outbox, OutboxRow, PublishFailure
from dedupe.retention import CleanerBusy, CleanupResult, Retention, cleanup
from dedupe.stats import OUTBOX_COUNT_CAP, TableStats, table_stats

__all__ = [
    "LEASE_EXPIRED",
    "NOTIFY_CHANNEL",
    "OUTBOX_COUNT_CAP",
    "Claim",
    "ClaimOutcome",
    "ClaimRow",
    "CleanerBusy",
    "CleanupResult",
    "DbConnection",
    "DedupeError",
    "DedupeKey",
    "Inbox",
    "KeyRecord",
    "MigrationError",
    "NotInTransaction",
    "Outbox",
    "OutboxRow",
    "PublishFailure",
    "Retention",
    "SchemaMissing",
    "SendIntent",
    "SendLedger",
    "SendResult",
    "SendRow",
    "SendStatus",
    "TableStats",
    "TargetKey",
    "UnknownOutcome",
    "available_migrations",
    "canonical_json",
    "check_schema",
    "cleanup",
    "fingerprint",
    "is_plain",
    "look_up",
    "migrate",
    "quote_ident",
    "table_stats",
]
