"""Operator tokens: made once, shown once, stored only as a hash; a role each.

As the send API's keys (`ingress.keys`): 32 random bytes (`iwc_` and URL-safe
base64), so a plain SHA-256 is the right hash. A token is looked up on every
request (the console's traffic is a person's clicks), so a revoked one stops
working at once.

    read       every page, and a replay's dry run
    operator   also replay and archive
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from enum import StrEnum

from dedupe import DbConnection, quote_ident

PREFIX = "iwc_"


class Role(StrEnum):
    READ = "read"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True, kw_only=True)
class Operator:
    name: str
    role: Role

    @property
    def may_act(self) -> bool:
        return self.role is Role.OPERATOR


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Tokens:
    """The `console_tokens` table of one schema."""

    def __init__(self, schema: str) -> None:
        self._table = f"{quote_ident(schema)}.console_tokens"

    async def create(self, conn: DbConnection, name: str, role: Role) -> str:
        """Make a token for `name`; the only time the token itself exists anywhere."""
        token = PREFIX + secrets.token_urlsafe(32)
        await conn.execute(
            f"INSERT INTO {self._table} (token_hash, name, role) VALUES ($1, $2, $3)",
            token_hash(token),
            name,
            role.value,
        )
        return token

    async def revoke(self, conn: DbConnection, name: str) -> bool:
        """Revoke `name`'s token; False if it has none that is live."""
        done = await conn.execute(
            f"UPDATE {self._table} SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
            name,
        )
        return bool(done != "UPDATE 0")

    async def operator(self, conn: DbConnection, token: str) -> Operator | None:
        """Who holds `token`, or None: never made, or revoked."""
        row = await conn.fetchrow(
            f"SELECT name, role FROM {self._table} WHERE token_hash = $1 AND revoked_at IS NULL",
            token_hash(token),
        )
        return None if row is None else Operator(name=row[0], role=Role(row[1]))
