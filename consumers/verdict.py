"""What happens to one delivery once its batch is decided."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import asyncpg


class Outcome(StrEnum):
    """The log event name of each outcome."""

    EFFECT_COMMITTED = "effect_committed"
    DUPLICATE_IGNORED = "duplicate_ignored"
    MESSAGE_ID_REUSED = "message_id_reused"
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    MESSAGE_CANCELLED = "message_cancelled"  # an ingress message cancelled before it was taken


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    outcome: Outcome
    reason: str = ""
    delay: float | None = None  # wanted delay for a retry (None: the policy's backoff)
    error: str = ""  # the exception, for the dead letter's headers and the log
    # False when waiting is not the message's fault (another worker holds its
    # send lease): it goes through a delay tier without spending an attempt.
    spend_attempt: bool = True


EFFECT = Verdict(outcome=Outcome.EFFECT_COMMITTED)
DUPLICATE = Verdict(outcome=Outcome.DUPLICATE_IGNORED)
REUSED = Verdict(outcome=Outcome.MESSAGE_ID_REUSED, reason="message_id_reused")
CANCELLED = Verdict(outcome=Outcome.MESSAGE_CANCELLED)


def dead(reason: str, error: str = "") -> Verdict:
    return Verdict(outcome=Outcome.DEAD_LETTERED, reason=reason, error=error)


def retry(
    reason: str, delay: float | None = None, error: str = "", *, spend_attempt: bool = True
) -> Verdict:
    return Verdict(
        outcome=Outcome.RETRY_SCHEDULED,
        reason=reason,
        delay=delay,
        error=error,
        spend_attempt=spend_attempt,
    )


# Errors after which the same statements may well succeed: retry the message.
TRANSIENT_SQL_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    asyncpg.LockNotAvailableError,
)


class DatabaseConnectionClosed(Exception):
    """A handler failed and its connection is closed: the database's fault, not the message's."""


# Errors of the framework's own database calls (never a handler's: those are
# the handler's, whatever their type) that mean the connection is gone or
# unusable: the whole batch is re-run once the database answers again.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseConnectionClosed,
    OSError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    # asyncpg's protocol lost track of a session the server terminated under
    # it ("cannot switch to state ..."): the connection is as good as gone.
    asyncpg.exceptions.InternalClientError,
    # The sessions' backstops (consumers.worker.create_pool): a claim that
    # waited on another worker's lock past statement_timeout, or a session
    # the server ended after idle_in_transaction_session_timeout.
    asyncpg.QueryCanceledError,
    asyncpg.IdleInTransactionSessionTimeoutError,
)


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."
