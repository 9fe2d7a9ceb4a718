"""The console's replay and archive buttons: one intent, acted on once.

A replay, in this order (the code below carries the same numbers):

1. The form carries an intent key, made when the page with the button was
   rendered (`console.intents`: checked for this sign-in, button, queue and
   filters before this is reached), and the filters the operator chose.
2. `Audit.begin` inserts the intent's row and commits. The primary key on
   the intent decides: of every request with this key (a double click, a
   resubmitted form, two tabs, two operators sharing a link) exactly one
   inserts the row; the others act on nothing and show that one's outcome.
   From here on, the key can never act again, whatever happens next.
3. `consumers.commands.replay.replay()`, the very function `dlq replay` calls,
   republishes what the filters pick (confirmed, then acked from the DLQ).
   It keeps each message's id, so the worker's claim decides: a message
   whose effect committed is acked as a duplicate, never run twice.
4. Each message's outcome and the action's end are written in one
   transaction. A console that dies between 2 and 4 leaves the action with
   no end (`finished_at` NULL): the page says so; a new intent (a new page)
   may replay again, which the claims make safe.

An archive differs at 3: `consumers.commands.archive.archive()` hands each message to
the audit, which commits it (headers and body) before the DLQ's ack.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import aio_pika
import asyncpg

from console.audit import Audit, done
from console.tokens import Operator
from consumers.commands.archive import archive
from consumers.commands.deadletters import DeadLetter
from consumers.commands.replay import Replayed, Selection, replay


@dataclass(frozen=True, slots=True, kw_only=True)
class Intent:
    key: str
    queue: str
    selection: Selection
    described: str  # the filters as the operator gave them, for the audit


async def replay_once(
    pool: asyncpg.Pool,
    connection: aio_pika.abc.AbstractConnection,
    audit: Audit,
    intent: Intent,
    operator: Operator,
    *,
    retention: datetime.timedelta,
    most: int,
) -> bool:
    """Replay what the intent picks unless its key acted already; True if this call acted."""
    async with pool.acquire() as conn:  # 2. one row per intent key, committed first
        if not await audit.begin(
            conn,
            intent=intent.key,
            action="replay",
            actor=operator.name,
            queue=intent.queue,
            selection=intent.described,
        ):
            return False
    outcomes: list[Replayed] = []
    try:
        await replay(  # 3. the same path as `dlq replay`
            connection,
            intent.queue,
            intent.selection,
            retention=retention,
            force=False,
            dry_run=False,
            most=most,
            report=outcomes.append,
        )
    except Exception as exc:
        await _finish(pool, audit, intent.key, outcomes, error=repr(exc))
        raise
    await _finish(pool, audit, intent.key, outcomes)  # 4.
    return True


async def _finish(
    pool: asyncpg.Pool,
    audit: Audit,
    intent: str,
    outcomes: list[Replayed],
    *,
    error: str | None = None,
) -> None:
    async with pool.acquire() as conn, conn.transaction():
        for n, one in enumerate(outcomes):
            await audit.record(conn, intent, n, done(one.letter, one.outcome, one.why))
        await audit.finish(conn, intent, error)


async def archive_once(
    pool: asyncpg.Pool,
    connection: aio_pika.abc.AbstractConnection,
    audit: Audit,
    intent: Intent,
    operator: Operator,
    *,
    most: int,
) -> bool:
    """Archive what the intent picks unless its key acted already; True if this call acted."""
    async with pool.acquire() as conn:
        if not await audit.begin(  # 2.
            conn,
            intent=intent.key,
            action="archive",
            actor=operator.name,
            queue=intent.queue,
            selection=intent.described,
        ):
            return False
        kept = 0

        async def keep(letter: DeadLetter) -> None:  # 3. committed before the DLQ's ack
            nonlocal kept
            await audit.record(conn, intent.key, kept, done(letter, "archived"), kept=letter)
            kept += 1

        try:
            await archive(connection, intent.queue, intent.selection, most=most, keep=keep)
        except Exception as exc:
            await audit.finish(conn, intent.key, repr(exc))
            raise
        await audit.finish(conn, intent.key)  # 4.
    return True
