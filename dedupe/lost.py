"""Which database errors mean "the connection is lost", not "this statement failed".

The framework's own database calls (a claim, a ledger write, a commit) that
raise one of `CONNECTION_ERRORS` re-run their whole step once the database
answers again; `TRANSIENT_SQL_ERRORS` are worth a retry of the message. A
handler's exception is never classified here: it is that message's alone.

A demoted primary (a failover made it a standby, or an operator set it
read-only) keeps its sessions and answers each write with SQLSTATE 25006,
ReadOnlySQLTransactionError: the connection is as lost as a closed one, but
the pool would hand it out again. `dropped_if_demoted(conn)` closes it
instead, so the pool's next connection, from a multi-host DATABASE_URL with
`target_session_attrs=read-write`, is to the new primary.

While no server takes writes (a failover under way), asyncpg's pool logs a
traceback each time it fails to reconnect its floor of connections
("Failed to restore the pool connection floor; retrying", on the
`asyncpg.pool` logger). `quiet_pool_logs()` turns each into one line,
`database_pool_reconnect_failed` with the error, and no traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg
import structlog

from dedupe.connection import DbConnection
from dedupe.errors import CommitOutcomeUnknown

log = structlog.get_logger(__name__)

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
    # A demoted primary's answer to a write: see dropped_if_demoted.
    asyncpg.ReadOnlySQLTransactionError,
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


def drop_if_demoted(conn: DbConnection, exc: BaseException) -> None:
    """Close `conn` if `exc` says its server no longer takes writes."""
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError) and not conn.is_closed():
        conn.terminate()


@contextlib.asynccontextmanager
async def dropped_if_demoted(conn: DbConnection) -> AsyncIterator[None]:
    """Close `conn` on a read-only error inside (a demoted primary), and re-raise it."""
    try:
        yield
    except asyncpg.ReadOnlySQLTransactionError as exc:
        drop_if_demoted(conn, exc)
        raise


POOL_FLOOR_WARNING = "Failed to restore the pool connection floor"


class _PoolFloorLine(logging.Filter):
    """asyncpg's floor-restore warning as one structured line, without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(POOL_FLOOR_WARNING):
            return True
        error = record.exc_info[1] if record.exc_info else None
        text = f"{type(error).__name__}: {error}" if error is not None else record.getMessage()
        log.warning("database_pool_reconnect_failed", error=text[:500])
        return False


def quiet_pool_logs() -> None:
    """Install the filter on asyncpg's pool logger (once, however often called)."""
    logger = logging.getLogger("asyncpg.pool")
    if not any(isinstance(f, _PoolFloorLine) for f in logger.filters):
        logger.addFilter(_PoolFloorLine())
