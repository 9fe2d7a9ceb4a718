"""A worker process's PostgreSQL pool: the configured schema first, the sessions named and
bounded by the worker's backstop."""

from __future__ import annotations

import math

import asyncpg

from consumers.settings import Settings
from dedupe import quote_ident


async def create_pool(
    settings: Settings,
    *,
    min_size: int = 1,
    name: str = "idempotent-workers",
    backstop_seconds: float | None = None,
) -> asyncpg.Pool:
    """An asyncpg pool whose search_path starts with the configured schema.

    `name` becomes the sessions' application_name, so `pg_stat_activity`
    shows which worker holds which connection. `backstop_seconds` sets the
    sessions' `statement_timeout` and `idle_in_transaction_session_timeout`:
    should a handler's deadline not end its transaction (the process stuck),
    the server ends it, and the claims it held free the other workers.
    """
    db = settings.database
    server_settings = {
        "search_path": f"{quote_ident(db.schema)}, public",
        "application_name": name[:63],
    }
    if backstop_seconds is not None:
        limit = str(math.ceil(backstop_seconds * 1000))
        server_settings["statement_timeout"] = limit
        server_settings["idle_in_transaction_session_timeout"] = limit
    pool = await asyncpg.create_pool(
        db.url,
        min_size=min_size,
        max_size=max(db.pool_size, min_size),
        server_settings=server_settings,
    )
    assert pool is not None
    return pool
