"""Errors raised by the PostgreSQL side.

DedupeError
  SchemaMissing     the tables are not there: run `idempotent-workers migrate`
  MigrationError    a migration file is malformed or failed to apply
"""

from __future__ import annotations


class DedupeError(Exception):
    """Root of every error raised by `dedupe`."""


class SchemaMissing(DedupeError):
    """The dedupe tables do not exist in the configured schema."""


class MigrationError(DedupeError):
    """A migration could not be applied."""
