"""Errors raised by the PostgreSQL side.

DedupeError
  SchemaMissing     the tables are not there: run `idempotent-workers migrate`
  MigrationError    a migration file is malformed or failed to apply
  NotInTransaction  a write that must share the caller's transaction got none
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
