"""API keys: made once, shown once, stored only as a hash; one key, one tenant.

A key is 32 random bytes (`iwk_` and URL-safe base64), so a plain SHA-256 is
the right hash: there is nothing to brute-force that a slow hash would
protect. What the table says of a key is remembered in this process's
memory, where each request's key is anyway:

- a key found: for `cache_seconds` (IW_INGRESS_KEY_CACHE_SECONDS, 30 by
  default), so the hot path neither reads a table nor hashes; a revoked key
  stops working within that time. Each read also stamps `last_used_at`, so
  `api-key list` knows when a key was last used, to within that time;
- a key not found: for `bad_key_seconds` (IW_INGRESS_BAD_KEY_SECONDS, 5), so
  a client retrying a wrong key costs one query per that time, not one per
  request. A flood of made-up keys still costs a query each (each is new),
  and each memory holds at most `REMEMBERED` keys (emptied when full).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import asyncpg

from dedupe import DbConnection, quote_ident

V = TypeVar("V")

PREFIX = "iwk_"
REMEMBERED = 10_000  # keys a memory holds at most, found or not
SHOWN_HASH_CHARS = 12  # of the hash's hex: what list shows and revoke takes


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyRow:
    """A key as `api-key list` shows it: never the key, the start of its hash."""

    hash_prefix: str
    tenant: str
    created_at: datetime
    last_used_at: datetime | None


class AmbiguousPrefix(ValueError):
    """More than one key's hash starts so: give more of it."""


class ApiKeys:
    """The `ingress_api_keys` table of one schema, with a memory of the keys asked about."""

    def __init__(
        self, schema: str, *, cache_seconds: float = 30.0, bad_key_seconds: float = 5.0
    ) -> None:
        self._table = f"{quote_ident(schema)}.ingress_api_keys"
        self._cache_seconds = cache_seconds
        self._bad_key_seconds = bad_key_seconds
        self._known: dict[str, tuple[str, float]] = {}
        self._refused: dict[str, float] = {}

    async def create(self, conn: DbConnection, tenant: str) -> str:
        """Make a key for `tenant`; the only time the key itself exists anywhere."""
        key = new_key()
        await conn.execute(
            f"INSERT INTO {self._table} (key_hash, tenant) VALUES ($1, $2)", key_hash(key), tenant
        )
        return key

    async def tenant_for(self, pool: asyncpg.Pool, key: str) -> str | None:
        """The key's tenant, or None for a key we never made (or revoked)."""
        now = time.monotonic()
        known = self._known.get(key)  # by the key itself: no hash per request once known
        if known is not None and known[1] > now:
            return known[0]
        if self._refused.get(key, 0.0) > now:
            return None
        tenant: str | None = await pool.fetchval(
            f"UPDATE {self._table} SET last_used_at = now() WHERE key_hash = $1 RETURNING tenant",
            key_hash(key),
        )
        if tenant is None:
            self._known.pop(key, None)
            _remember(self._refused, key, now + self._bad_key_seconds)
            return None
        self._refused.pop(key, None)
        _remember(self._known, key, (tenant, now + self._cache_seconds))
        return tenant

    async def list(self, conn: DbConnection) -> list[KeyRow]:
        rows = await conn.fetch(
            f"SELECT encode(key_hash, 'hex') AS hash, tenant, created_at, last_used_at"
            f" FROM {self._table} ORDER BY tenant, created_at"
        )
        return [
            KeyRow(
                hash_prefix=r["hash"][:SHOWN_HASH_CHARS],
                tenant=r["tenant"],
                created_at=r["created_at"],
                last_used_at=r["last_used_at"],
            )
            for r in rows
        ]

    async def revoke(self, conn: DbConnection, hash_prefix: str) -> KeyRow | None:
        """Delete the one key whose hash starts with `hash_prefix` (hex); None if none does."""
        prefix = hash_prefix.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            return None
        async with conn.transaction():
            rows = await conn.fetch(
                f"SELECT key_hash, tenant, created_at, last_used_at FROM {self._table}"
                " WHERE starts_with(encode(key_hash, 'hex'), $1) FOR UPDATE",
                prefix,
            )
            if len(rows) > 1:
                raise AmbiguousPrefix(f"{len(rows)} keys' hashes start with {prefix}")
            if not rows:
                return None
            await conn.execute(f"DELETE FROM {self._table} WHERE key_hash = $1", rows[0][0])
        row = rows[0]
        return KeyRow(
            hash_prefix=row["key_hash"].hex()[:SHOWN_HASH_CHARS],
            tenant=row["tenant"],
            created_at=row["created_at"],
            last_used_at=row["last_used_at"],
        )


def _remember(memory: dict[str, V], key: str, value: V) -> None:
    if len(memory) >= REMEMBERED:
        memory.clear()
    memory[key] = value
