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

`hold=False` (a pool with no room for one connection per loop beside the
worker's other users) gives the connection back after every batch, as a
plain `pool.acquire()` does. Session state a handler sets outside its
transaction (`SET` without `LOCAL`) stays with the loop's next batches while
the connection is held.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from asyncpg.pool import PoolConnectionProxy


class HeldConnection:
    """A pool connection a batch loop keeps between its batches."""

    def __init__(self, pool: asyncpg.Pool, *, hold: bool = True) -> None:
        self.pool = pool
        self.hold = hold
        self._conn: PoolConnectionProxy[asyncpg.Record] | None = None

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
        if self.hold and not conn.is_closed() and not conn.is_in_transaction():
            self._conn = conn
        else:  # 3.
            await self._give_back(conn)

    async def release(self) -> None:
        """Give the held connection back to the pool (4.). Idempotent."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._give_back(conn)

    async def _give_back(self, conn: PoolConnectionProxy[asyncpg.Record]) -> None:
        # The pool resets it; one it cannot reset it terminates (and replaces on a
        # later acquire) before re-raising the reset's error, which would only
        # hide the batch's own: the connection is back either way.
        with contextlib.suppress(Exception):
            await self.pool.release(conn)
