"""Errors raised by the PostgreSQL side.

DedupeError
  SchemaMissing     the tables are not there: run `idempotent-workers migrate`
  MigrationError    a migration file is malformed or failed to apply
  NotInTransaction  a write that must share the caller's transaction got none
  KeyVanished       an idempotency key conflicted, then was gone: try again
  CommitOutcomeUnknown  a commit the primary kept but its synchronous standby
                    may not have (the wait was cancelled): promise nothing,
                    let redelivery decide
"""

from __future__ import annotations


class DedupeError(Exception):
    """Root of every error raised by `dedupe`."""


class SchemaMissing(DedupeError):
    """The dedupe tables do not exist in the configured schema."""


class MigrationError(DedupeError):
    """A migration could not be applied."""


class NotInTransaction(DedupeError):
    """`Outbox.enqueue` was called outside a transaction: the row would not share its fate."""


class KeyVanished(DedupeError):
    """An idempotency key conflicted, then was gone (retention ran in between): try again."""


class CommitOutcomeUnknown(DedupeError):
    """The commit returned, but its wait for the synchronous standby was cancelled.

    A failover may lose it. Do not acknowledge or answer on it: a redelivery's
    claim finds the key and waits for the standby (`dedupe.replication`).
    """
