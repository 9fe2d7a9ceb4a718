"""A commit the standby may not have: PostgreSQL's synchronous-replication cancel.

With synchronous replication a COMMIT is written locally, then waits for a
standby to confirm it. When that wait is interrupted, PostgreSQL
(src/backend/replication/syncrep.c) does not undo the local commit:

    cancel (pg_cancel_backend)   WARNING 01000 "canceling wait for synchronous
                                 replication due to user request", then COMMIT
                                 completes as a success
    terminate, fast shutdown     WARNING 57P01 "canceling the wait for synchronous
                                 replication and terminating connection due to
                                 administrator command", then the connection closes

Both carry DETAIL "The transaction has already committed locally, but might
not have been replicated to the standby." A failover to that standby loses
the transaction, so a caller must not promise anything on it: `replicated()`
turns the first case into CommitOutcomeUnknown (the second already fails as
a lost connection).

How the warning is heard. asyncpg hands a notice to the connection's log
listeners with `loop.call_soon` while it reads the server's messages
(`Connection._process_log_message`), and the notice precedes the COMMIT's
CommandComplete and ReadyForQuery. The task awaiting the COMMIT is woken by
its future's callback, also scheduled with `call_soon` and later, so a plain
(not async) listener has run before the `await` returns; `replicated()`
still yields once before it reads what was heard, so the order holds even for
a notice delivered one loop turn late. The listener is added per commit and
removed after: the pool's release resets a connection, log listeners
included, so one added when the connection was made would be gone.

What a worker says at start (`read_replication`): a primary with standbys
whose commits wait for none of them (`synchronous_standby_names` empty, or
`synchronous_commit` local or off for our sessions) acknowledges commits a
failover can lose; `ReplicationState.unprotected` names that case.

The second half of the promise is in the claims (`dedupe.inbox`,
`dedupe.messages`): a transaction that found a key already claimed holds a
transaction id, so its COMMIT waits for the standby too, and a duplicate is
answered only once the first commit is replicated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg

from dedupe.connection import DbConnection
from dedupe.errors import CommitOutcomeUnknown

WARNING_SQLSTATE = "01000"
CANCEL_MESSAGE = "canceling wait for synchronous replication"


def is_replication_cancel(message: asyncpg.PostgresLogMessage) -> bool:
    """Whether `message` is the cancel warning of a commit left unreplicated."""
    text = str(getattr(message, "message", "") or "")
    return getattr(message, "sqlstate", None) == WARNING_SQLSTATE and text.startswith(
        CANCEL_MESSAGE
    )


@contextlib.asynccontextmanager
async def replicated(conn: DbConnection) -> AsyncIterator[None]:
    """The commits inside reached the synchronous standby, or CommitOutcomeUnknown.

        async with replicated(conn):
            await tx.commit()       # a cancelled wait raises on leaving the block

    Wrap the statement that commits (a COMMIT, or a statement run outside a
    transaction). Without synchronous replication nothing is ever heard.
    """
    heard: list[str] = []

    def listen(_conn: Any, message: asyncpg.PostgresLogMessage) -> None:
        if is_replication_cancel(message):
            heard.append(str(message.message))

    try:
        conn.add_log_listener(listen)
        listening = True
    except asyncpg.InterfaceError:  # the connection is gone: the statements inside say so
        listening = False
    try:
        yield
        await asyncio.sleep(0)  # a notice read in the last turn reaches `listen` first
    finally:
        if listening:  # a lost connection's proxy refuses every call: keep the real error
            with contextlib.suppress(asyncpg.InterfaceError):
                conn.remove_log_listener(listen)
    if heard:
        raise CommitOutcomeUnknown(
            f"{heard[0]}: committed on the primary, maybe not on its standby"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicationState:
    """What the primary and our session say about replication."""

    standbys: int  # connected streaming standbys (pg_stat_replication)
    synchronous_standby_names: str
    synchronous_commit: str  # as our sessions have it

    @property
    def commits_wait(self) -> bool:
        """Whether a COMMIT waits for a standby before it returns."""
        return bool(self.synchronous_standby_names.strip()) and self.synchronous_commit not in (
            "local",
            "off",
        )

    @property
    def unprotected(self) -> bool:
        """Standbys a failover could promote, and commits that do not wait for them."""
        return self.standbys > 0 and not self.commits_wait


async def read_replication(conn: DbConnection) -> ReplicationState:
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM pg_stat_replication),"
        " current_setting('synchronous_standby_names'), current_setting('synchronous_commit')"
    )
    assert row is not None
    return ReplicationState(
        standbys=int(row[0]), synchronous_standby_names=row[1], synchronous_commit=row[2]
    )
