"""Group commit: the requests that arrive together share one transaction.

    submit(request) -> waits in line
    a lane takes every request waiting (up to max_batch) -> BEGIN
        key rows (the unique index decides races), message rows, and for each
        new message its outbox row: the push job, message_id derived from the
        message id, the ingress header naming the message
    COMMIT -> each request gets its answer: queued | duplicate_ignored | reused

Each of `lanes` loops runs one transaction at a time on its own pooled
connection, so while one commits the next requests gather for another: under
load a commit carries many requests, and one fsync answers them all. Until
COMMIT returns no request is answered, so a 202 always names committed rows;
a failed transaction fails every request in it (the client retries them with
the same keys, which is safe).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import asyncpg
import structlog

from dedupe import (
    INGRESS_HEADER,
    Acceptance,
    Accepted,
    Messages,
    NewMessage,
    Outbox,
    job_message_id,
)

log = structlog.get_logger(__name__)


@dataclass(slots=True, kw_only=True)
class Submission:
    message: NewMessage
    job: bytes  # the push job as JSON, the idempotency key left out
    answer: asyncio.Future[Accepted] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Committer:
    """Runs the transactions of accepted requests, many requests to a commit."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        messages: Messages,
        outbox: Outbox,
        *,
        max_batch: int = 256,
        lanes: int = 2,
    ) -> None:
        self._pool = pool
        self._messages = messages
        self._outbox = outbox
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

    async def submit(self, message: NewMessage, job: bytes) -> Accepted:
        submission = Submission(message=message, job=job)
        self._waiting.append(submission)
        self._arrived.set()
        return await submission.answer

    async def _lane(self) -> None:
        while True:
            await self._arrived.wait()
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            if not self._waiting:
                self._arrived.clear()
            if not batch:
                continue
            try:
                answers = await self._commit(batch)
            except asyncio.CancelledError:
                for s in batch:
                    s.answer.cancel()
                raise
            except Exception as exc:
                log.warning("ingress_commit_failed", requests=len(batch), error=repr(exc))
                for s in batch:
                    if not s.answer.done():
                        s.answer.set_exception(exc)
                continue
            for s, answer in zip(batch, answers, strict=True):
                if not s.answer.done():  # its HTTP request may have gone meanwhile
                    s.answer.set_result(answer)

    async def _commit(self, batch: list[Submission]) -> list[Accepted]:
        async with self._pool.acquire() as conn, conn.transaction():
            answers = await self._messages.accept(conn, [s.message for s in batch])
            jobs = [
                self._outbox.row_args(
                    queue=s.message.queue,
                    body=s.job,
                    message_id=job_message_id(answer.id),
                    tenant=s.message.tenant,
                    headers={INGRESS_HEADER: str(answer.id)},
                )
                for s, answer in zip(batch, answers, strict=True)
                if answer.outcome is Acceptance.QUEUED and answer.id is not None
            ]
            if jobs:  # one pipelined round trip for every new message's job
                await conn.executemany(self._outbox.insert_sql, jobs)
        return answers  # committed: only now does any request hear `queued`
