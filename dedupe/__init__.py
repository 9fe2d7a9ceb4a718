"""The PostgreSQL side: migrations, the inbox of processed messages, the send ledger,
the outbox, the HTTP send API's messages, compare-and-set transitions."""

from dedupe.connection import DbConnection
from dedupe.errors import (
    CommitOutcomeUnknown,
    DedupeError,
    KeyVanished,
    MigrationError,
    NotInTransaction,
    SchemaMissing,
)
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
from dedupe.lookup import ClaimRow, KeyRecord, claims, look_up
from dedupe.messages import (
    INGRESS_HEADER,
    PART_TARGETS,
    Acceptance,
    Accepted,
    Messages,
    MessageStatus,
    MessageView,
    NewMessage,
    TargetState,
    job_message_id,
    parse_message_id,
    part_message_ids,
)
from dedupe.migrate import available_migrations, check_schema, migrate, quote_ident
from dedupe.outbox import NOTIFY_CHANNEL, Outbox, OutboxRow, PublishFailure
from dedupe.quota import QUOTA_CHANNEL, Grant, ProviderQuotas, paused_notice
from dedupe.replication import (
    ReplicationState,
    is_replication_cancel,
    read_replication,
    replicated,
)
from dedupe.retention import CleanerBusy, CleanupResult, Retention, cleanup
from dedupe.stats import OUTBOX_COUNT_CAP, TableStats, table_stats
from dedupe.transition import Transition, transition

__all__ = [
    "INGRESS_HEADER",
    "LEASE_EXPIRED",
    "NOTIFY_CHANNEL",
    "OUTBOX_COUNT_CAP",
    "PART_TARGETS",
    "QUOTA_CHANNEL",
    "Acceptance",
    "Accepted",
    "Claim",
    "ClaimOutcome",
    "ClaimRow",
    "CleanerBusy",
    "CleanupResult",
    "CommitOutcomeUnknown",
    "DbConnection",
    "DedupeError",
    "DedupeKey",
    "Grant",
    "Inbox",
    "KeyRecord",
    "KeyVanished",
    "MessageStatus",
    "MessageView",
    "Messages",
    "MigrationError",
    "NewMessage",
    "NotInTransaction",
    "Outbox",
    "OutboxRow",
    "ProviderQuotas",
    "PublishFailure",
    "ReplicationState",
    "Retention",
    "SchemaMissing",
    "SendIntent",
    "SendLedger",
    "SendResult",
    "SendRow",
    "SendStatus",
    "TableStats",
    "TargetKey",
    "TargetState",
    "Transition",
    "UnknownOutcome",
    "available_migrations",
    "canonical_json",
    "check_schema",
    "claims",
    "cleanup",
    "fingerprint",
    "is_plain",
    "is_replication_cancel",
    "job_message_id",
    "look_up",
    "migrate",
    "parse_message_id",
    "part_message_ids",
    "paused_notice",
    "quote_ident",
    "read_replication",
    "replicated",
    "table_stats",
    "transition",
]
