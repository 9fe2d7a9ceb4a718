"""One pool connection kept by a batch loop from one batch to the next.

Giving a connection back to asyncpg's pool resets it (`Connection.reset`:
a round trip running `RESET ALL`, `UNLISTEN *`, `CLOSE ALL`, advisory locks
released) and drops its log listeners. A batch loop runs one batch at a time
on the same queue, so between two of its batches there is nothing to reset
against: `HeldConnection` keeps the connection after a clean batch and hands
it to the next one, a round trip fewer per batch.

1. A connection found closed (the server restarted, a demoted primary's
   connection was terminated) goes back to the pool, which connects anew,
   and the batch gets the new one: a batch never starts on a dead connection.
2. A batch that raised (a lost connection, an unknown commit, a handler's
   failure sent to the careful path) gives its connection back to the pool:
   the pool's reset rolls back what is left and terminates a connection it
   cannot reset (and replaces on the next acquire). The next batch starts
   on a clean one.
3. A connection still in a transaction after a batch is given back too.
4. `release()` at the loop's end: the pool closes only once every connection
   is back.

The held connection also saves the next batch its BEGIN. When the next batch
is already waiting as one commits (under load, nearly always), `commit`
sends COMMIT AND CHAIN: PostgreSQL commits and begins the next transaction
in the same round trip, and `begin` hands that transaction to the next batch.
It is the same asyncpg `Transaction`, still started, so savepoints
(`conn.transaction()` inside) work as in any batch. A chained transaction
is empty until its batch runs: no snapshot, no locks, nothing written.

5. A chained transaction older than CHAINED_FRESH_SECONDS when its batch
   starts is begun anew (ROLLBACK AND CHAIN, one round trip, as a BEGIN):
   `now()` in a handler is never staler than that. One whose batch never
   comes (its deliveries all stale, then a quiet queue) is ended by the
   session's `idle_in_transaction_session_timeout` (the worker sets it), and
   the next batch gets a new connection (1.).
6. A connection given back rolls its chained transaction back first: none is
   left open, none reaches the pool. A chain is only ever on the held
   connection: 1. to 3. give back (and so end) any other.

`hold=False` (a pool with no room for one connection per loop beside the
worker's other users) gives the connection back after every batch, as a
plain `pool.acquire()` does. Session state a handler sets outside its
transaction (`SET` without `LOCAL`) stays with the loop's next batches while
the connection is held.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from asyncpg.transaction import Transaction

from consumers.pipeline.database_loss import rollback_quietly

# How old a chained transaction may be when its batch starts (5.). It was begun
# because a batch was waiting, so it is normally a few milliseconds old (the
# settling of the batch before); older, it waited on something else (a settle
# stalled on the broker, all of a batch's deliveries stale) and is begun anew.
CHAINED_FRESH_SECONDS = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class _Chained:
    """The transaction a COMMIT AND CHAIN began on the held connection, for the next batch."""

    tx: Transaction
    began: float  # time.monotonic()


class HeldConnection:
    """A pool connection a batch loop keeps between its batches."""

    def __init__(self, pool: asyncpg.Pool, *, hold: bool = True) -> None:
        self.pool = pool
        self.hold = hold
        self._conn: PoolConnectionProxy[asyncpg.Record] | None = None
        self._chained: _Chained | None = None

    @contextlib.asynccontextmanager
    async def acquired(self) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        """The held connection, or a fresh one from the pool, for one batch."""
        conn = self._conn
        self._conn = None
        if conn is not None and conn.is_closed():  # 1.
            await self._give_back(conn)
            conn = None
        if conn is None:
            conn = await self.pool.acquire()
        try:
            yield conn
        except BaseException:  # 2.
            await self._give_back(conn)
            raise
        if self.hold and not conn.is_closed() and not self._open_unchained(conn):
            self._conn = conn
        else:  # 3.
            await self._give_back(conn)

    async def begin(self, conn: PoolConnectionProxy[asyncpg.Record]) -> Transaction:
        """The batch's transaction on `conn`, started: the one the last COMMIT AND
        CHAIN began (no round trip), or a new one (BEGIN)."""
        chained, self._chained = self._chained, None
        if chained is not None and conn.is_in_transaction():  # `conn` is the held one (6.)
            if time.monotonic() - chained.began > CHAINED_FRESH_SECONDS:  # 5.
                await conn.execute("ROLLBACK AND CHAIN")
            return chained.tx
        if chained is not None:  # the server ended it: end asyncpg's record of it too
            await rollback_quietly(chained.tx)
        tx = conn.transaction()
        await tx.start()
        return tx

    async def commit(
        self, conn: PoolConnectionProxy[asyncpg.Record], tx: Transaction, *, chain: bool
    ) -> None:
        """Commit `tx`; with `chain` (the next batch is waiting) on a held connection,
        begin the next batch's transaction in the same round trip."""
        if not (chain and self.hold):
            await tx.commit()
            return
        try:
            await conn.execute("COMMIT AND CHAIN")
        except BaseException:
            await rollback_quietly(tx)  # a failed COMMIT began nothing: asyncpg's state too
            raise
        self._chained = _Chained(tx=tx, began=time.monotonic())

    async def release(self) -> None:
        """Give the held connection back to the pool (4.). Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._give_back(conn)

    def _open_unchained(self, conn: PoolConnectionProxy[asyncpg.Record]) -> bool:
        """`conn` is in a transaction that is not the one chained for the next batch."""
        return conn.is_in_transaction() and self._chained is None

    async def _give_back(self, conn: PoolConnectionProxy[asyncpg.Record]) -> None:
        chained, self._chained = self._chained, None
        if chained is not None:  # 6.
            await rollback_quietly(chained.tx)
        # The pool resets it; one it cannot reset it terminates (and replaces on a
        # later acquire) before re-raising the reset's error, which would only
        # hide the batch's own: the connection is back either way.
        with contextlib.suppress(Exception):
            await self.pool.release(conn)
