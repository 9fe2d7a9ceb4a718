"""API keys: made once, shown once, stored only as a hash; one key, one tenant.

A key is 32 random bytes (`iwk_` and URL-safe base64), so a plain SHA-256 is
the right hash: there is nothing to brute-force that a slow hash would
protect. A key found in the database is remembered (in this process's
memory, where each request's key is anyway) for `cache_seconds`, so the hot
path neither reads a table nor hashes; a key deleted from the table stops
working within that time.
"""

from __future__ import annotations

import hashlib
import secrets
import time

import asyncpg

from dedupe import DbConnection, quote_ident

PREFIX = "iwk_"


def new_key() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    """The `ingress_api_keys` table of one schema, with a small cache of known keys."""

    def __init__(self, schema: str, *, cache_seconds: float = 30.0) -> None:
        self._table = f"{quote_ident(schema)}.ingress_api_keys"
        self._cache_seconds = cache_seconds
        self._known: dict[str, tuple[str, float]] = {}

    async def create(self, conn: DbConnection, tenant: str) -> str:
        """Make a key for `tenant`; the only time the key itself exists anywhere."""
        key = new_key()
        await conn.execute(
            f"INSERT INTO {self._table} (key_hash, tenant) VALUES ($1, $2)", key_hash(key), tenant
        )
        return key

    async def tenant_for(self, pool: asyncpg.Pool, key: str) -> str | None:
        """The key's tenant, or None for a key we never made."""
        known = self._known.get(key)  # by the key itself: no hash per request once known
        now = time.monotonic()
        if known is not None and known[1] > now:
            return known[0]
        tenant: str | None = await pool.fetchval(
            f"SELECT tenant FROM {self._table} WHERE key_hash = $1", key_hash(key)
        )
        if tenant is None:
            self._known.pop(key, None)
            return None
        if len(self._known) > 10_000:  # keys are few; a flood of made-up ones never lands here
            self._known.clear()
        self._known[key] = (tenant, now + self._cache_seconds)
        return tenant
