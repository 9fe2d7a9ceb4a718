"""Compare-and-set on a status column: of two racing callers, exactly one wins.

The classic case: two admins approve one refund at the same moment. Reading
the status, checking it in Python and then writing it lets both pass the
check. One UPDATE with the expected status in its WHERE clause does not: the
row lock orders the two, the second re-reads the row once the first commits,
no longer matches, and changes nothing. The row count decides, and the
winner writes its effect in the same transaction:

    async with conn.transaction():
        moved = await transition(
            conn, "refunds", {"id": refund_id}, expected="pending", to="approved"
        )
        if moved.won:
            await conn.execute(
                "INSERT INTO payouts (refund_id, amount) SELECT id, amount"
                " FROM refunds WHERE id = $1", refund_id)
        elif moved.status == "approved":
            ...  # the other admin won: already approved, success, nothing done
        elif moved.status is None:
            ...  # no such refund: 404
        else:
            ...  # rejected, paid, ...: 409, say which

The loser learns the status that beat it from a second statement, which in
PostgreSQL's default READ COMMITTED level takes a fresh snapshot and so sees
the winner's committed row. (Under REPEATABLE READ or SERIALIZABLE the losing
UPDATE raises a serialization error instead: retry the transaction.)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dedupe.connection import DbConnection
from dedupe.migrate import quote_ident


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """What one compare-and-set did."""

    won: bool  # this call moved the row; its effects belong in the same transaction
    status: str | None  # the row's status now: `to` when won; None when there is no such row

    def already(self, status: str) -> bool:
        """Lost, and the row is in `status`: someone else did it (success, nothing to do)."""
        return not self.won and self.status == status


async def transition(
    tx: DbConnection,
    table: str,
    key: Mapping[str, object],
    *,
    expected: str | Collection[str],
    to: str,
    column: str = "status",
    schema: str | None = None,
    touch: str | None = None,
) -> Transition:
    """Move the row `key` names from `expected` (one status or several) to `to`.

    `table` and the column names are quoted as identifiers (never pass user
    input as names); `key` maps column names to values. `touch`: a timestamp
    column set to now() by the winner (`updated_at`, say).
    """
    if not key:
        raise ValueError("transition needs a key: a column and its value at least")
    allowed = [expected] if isinstance(expected, str) else list(expected)
    target = quote_ident(table) if schema is None else f"{quote_ident(schema)}.{quote_ident(table)}"
    names = list(key)
    where = " AND ".join(f"{quote_ident(n)} = ${i}" for i, n in enumerate(names, start=1))
    status = quote_ident(column)
    n = len(names)
    touched = f", {quote_ident(touch)} = now()" if touch else ""
    moved = await tx.fetchval(
        f"UPDATE {target} SET {status} = ${n + 1}{touched}"
        f" WHERE {where} AND {status} = ANY(${n + 2}::text[]) RETURNING {status}",
        *key.values(),
        to,
        allowed,
    )
    if moved is not None:
        return Transition(won=True, status=to)
    now = await tx.fetchval(f"SELECT {status} FROM {target} WHERE {where}", *key.values())
    return Transition(won=False, status=None if now is None else str(now))
