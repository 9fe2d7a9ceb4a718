"""Which database errors mean "the connection is lost", not "this statement failed".

The framework's own database calls (a claim, a ledger write, a commit) that
raise one of `CONNECTION_ERRORS` re-run their whole step once the database
answers again; `TRANSIENT_SQL_ERRORS` are worth a retry of the message. A
handler's exception is never classified here: it is that message's alone.
"""

from __future__ import annotations

import asyncpg

from dedupe.errors import CommitOutcomeUnknown

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
    # A commit the primary kept after its wait for the synchronous standby was
    # cancelled (dedupe.replication): as unknown as a commit cut off mid-way.
    # The re-run's claims find the keys and wait for the standby before any ack.
    CommitOutcomeUnknown,
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
    # The sessions' backstops (consumers.runtime.worker.create_pool): a claim that
    # waited on another worker's lock past statement_timeout, or a session
    # the server ended after idle_in_transaction_session_timeout.
    asyncpg.QueryCanceledError,
    asyncpg.IdleInTransactionSessionTimeoutError,
)
