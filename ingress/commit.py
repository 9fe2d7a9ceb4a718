"""Group commit: the requests that arrive together share one statement and one commit.

    submit(request) -> waits in line
    a lane takes every request waiting (up to max_batch) ->
        Messages.accept: ONE statement, its own transaction: key rows (the
        unique index decides races), message rows, outbox rows
    committed -> each request gets its own answer: queued | duplicate_ignored | reused

Each of `lanes` loops holds one connection and runs one statement at a time,
so while one commits the next requests gather for another: under load a
commit carries many requests, and one round trip and one fsync answer them
all. The lane keeps its connection (no pool acquire and reset per commit)
until the connection fails.

Until the commit returns no request is answered, so a 202 always names
committed rows; with synchronous replication, rows the standby has too: a
commit whose wait for the standby was cancelled (`dedupe.replication`) is
answered as a lost connection, and the client's retry with the same key gets
its 202 once the first commit is replicated. A group the database refuses
stores nothing (one statement); then:
- the connection failed (unreachable, terminated, timed out): every request
  of the group gets the error (503; the client retries with the same key,
  which is safe whether or not the commit happened);
- the database refused the statement (an error of one request's data, a
  deadlock, a missing table): each request is run again alone, so one
  request's failure is its own and its groupmates get their own answers.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import asyncpg
import structlog

from dedupe import Accepted, Messages, NewMessage, replicated
from dedupe.lost import CONNECTION_ERRORS, drop_if_demoted

log = structlog.get_logger(__name__)


@dataclass(slots=True, kw_only=True)
class Submission:
    message: NewMessage
    answer: asyncio.Future[Accepted] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Committer:
    """Runs the statements of accepted requests, many requests to a commit."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        messages: Messages,
        *,
        max_batch: int = 256,
        lanes: int = 2,
    ) -> None:
        self._pool = pool
        self._messages = messages
        self._max_batch = max_batch
        self._lanes = lanes
        self._waiting: list[Submission] = []
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._lane()) for _ in range(self._lanes)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for waiting in self._waiting:
            waiting.answer.cancel()

    async def submit(self, message: NewMessage) -> Accepted:
        submission = Submission(message=message)
        self._waiting.append(submission)
        self._arrived.set()
        return await submission.answer

    async def _lane(self) -> None:
        lane = _Lane(self._pool)
        try:
            while True:
                await self._arrived.wait()
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
                if not self._waiting:
                    self._arrived.clear()
                if not batch:
                    continue
                try:
                    await self._settle(lane, batch)
                except asyncio.CancelledError:
                    for s in batch:
                        s.answer.cancel()
                    raise
        finally:
            await lane.close()

    async def _settle(self, lane: _Lane, batch: list[Submission]) -> None:
        """Answer every request of `batch`: its outcome, or the error that stopped it."""
        conn = None
        try:
            conn = await lane.connection()
            async with replicated(conn):  # a cancelled wait for the standby: no 202 on it
                answers = await self._messages.accept(conn, [s.message for s in batch])
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            connection_failed = isinstance(exc, CONNECTION_ERRORS)
            if connection_failed:
                if conn is not None:  # a demoted primary's is not handed out again
                    drop_if_demoted(conn, exc)
                await lane.drop()
            log.warning("ingress_commit_failed", requests=len(batch), error=repr(exc))
            if len(batch) > 1 and not connection_failed:
                for s in batch:  # one request's failure must not be its groupmates'
                    await self._settle(lane, [s])
                return
            for s in batch:
                if not s.answer.done():
                    s.answer.set_exception(exc)
            return
        for s, answer in zip(batch, answers, strict=True):
            if not s.answer.done():  # its HTTP request may have gone meanwhile
                s.answer.set_result(answer)


class _Lane:
    """One lane's connection: taken from the pool once, given back when it fails."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._conn: asyncpg.pool.PoolConnectionProxy | None = None

    async def connection(self) -> asyncpg.pool.PoolConnectionProxy:
        if self._conn is None:
            self._conn = await self._pool.acquire()
        return self._conn

    async def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # the pool replaces a broken one
                await self._pool.release(conn)

    async def close(self) -> None:
        await self.drop()
