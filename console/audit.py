"""The audit of every replay and archive: who, when, what, and each message's outcome.

`console_actions` has the intent key (`console.intents`, checked before this
is reached) as its primary key. `begin()` inserts
the action's row and commits it before anything is done; of all the
requests carrying one key (a double click, a resubmitted form, two tabs)
exactly one inserts it, and only that one acts. The others read the row
(once the winner's insert commits) and show what it did.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import asyncpg

from consumers.commands.deadletters import DeadLetter
from consumers.commands.printable import printable
from dedupe import DbConnection, quote_ident


@dataclass(frozen=True, slots=True, kw_only=True)
class Done:
    """What an action did to one message (the audit keeps escaped text)."""

    message_id: str
    tenant: str
    reason: str
    outcome: str
    why: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    intent_key: str
    action: str
    actor: str
    queue: str
    selection: str
    started_at: datetime.datetime
    finished_at: datetime.datetime | None
    error: str | None
    messages: tuple[Done, ...] = ()


def done(letter: DeadLetter, outcome: str, why: str = "") -> Done:
    return Done(
        message_id=printable(letter.message_id),
        tenant=printable(letter.tenant),
        reason=printable(letter.reason),
        outcome=outcome,
        why=printable(why),
    )


class Audit:
    """The console's audit tables of one schema."""

    def __init__(self, schema: str) -> None:
        q = quote_ident(schema)
        self._actions = f"{q}.console_actions"
        self._messages = f"{q}.console_action_messages"

    async def begin(
        self,
        conn: DbConnection,
        *,
        intent: str,
        action: str,
        actor: str,
        queue: str,
        selection: str,
    ) -> bool:
        """Record the intent; True for the one request that inserted it and may act."""
        won = await conn.fetchval(
            f"INSERT INTO {self._actions} (intent_key, action, actor, queue, selection)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (intent_key) DO NOTHING RETURNING true",
            intent,
            action,
            printable(actor),
            printable(queue),
            printable(selection),
        )
        return bool(won)

    async def record(
        self,
        conn: DbConnection,
        intent: str,
        n: int,
        what: Done,
        *,
        kept: DeadLetter | None = None,
    ) -> None:
        """One message's outcome; `kept`: an archived message, its headers and body kept."""
        await conn.execute(
            f"INSERT INTO {self._messages}"
            " (intent_key, n, message_id, tenant, reason, outcome, why, headers, body)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            intent,
            n,
            what.message_id,
            what.tenant,
            what.reason,
            what.outcome,
            what.why,
            None if kept is None else printable(repr(kept.message.headers or {})),
            None if kept is None else kept.message.body,
        )

    async def finish(self, conn: DbConnection, intent: str, error: str | None = None) -> None:
        await conn.execute(
            f"UPDATE {self._actions} SET finished_at = now(), error = $2 WHERE intent_key = $1",
            intent,
            None if error is None else printable(error),
        )

    async def find(self, conn: DbConnection, intent: str) -> Action | None:
        row = await conn.fetchrow(f"SELECT * FROM {self._actions} WHERE intent_key = $1", intent)
        if row is None:
            return None
        rows = await conn.fetch(
            "SELECT message_id, tenant, reason, outcome, why"
            f" FROM {self._messages} WHERE intent_key = $1 ORDER BY n",
            intent,
        )
        return _action(row, tuple(Done(**dict(r)) for r in rows))

    async def recent(self, conn: DbConnection, most: int = 100) -> list[Action]:
        rows = await conn.fetch(
            f"SELECT * FROM {self._actions} ORDER BY started_at DESC LIMIT $1", most
        )
        return [_action(row, ()) for row in rows]


def _action(row: asyncpg.Record, messages: tuple[Done, ...]) -> Action:
    return Action(
        intent_key=row["intent_key"],
        action=row["action"],
        actor=row["actor"],
        queue=row["queue"],
        selection=row["selection"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        error=row["error"],
        messages=messages,
    )
