"""Provider quotas the fleet keeps together: a token bucket per quota in one row.

Every worker of a fleet sending to one provider project (an FCM project, an
APNs topic) takes its sends' tokens from one row of `provider_quotas`:

1. `configure` writes the quota's rate and burst (a worker does at start; the
   bucket's tokens are kept, capped at the new burst);
2. `take(name, wanted)` is one statement: it refills the bucket by the time
   since the last take (`per_second` a second, at most `burst`), grants up to
   `wanted` whole tokens (none while paused) and says what is left and how
   long the pause lasts; the row is locked for that statement only;
3. `pause(name, seconds)` moves `paused_until` to at least `seconds` from now
   (a 429's Retry-After) and NOTIFYs QUOTA_CHANNEL, so every listening worker
   stops sending to that provider before its next take.

Clocks: PostgreSQL's (`clock_timestamp()`, read once per statement), never a
worker's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from dedupe.connection import DbConnection
from dedupe.migrate import quote_ident

# NOTIFY payload: {"schema": ..., "name": ..., "seconds": ...} (the pause left).
QUOTA_CHANNEL = "idempotent_workers_quota"


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What one take got: `granted` tokens; `left` tokens in the bucket after it;
    `paused_seconds` of a provider's pause left (0: none); the bucket's `per_second`."""

    granted: int
    left: float
    paused_seconds: float
    per_second: float


class ProviderQuotas:
    """The `provider_quotas` table of one schema."""

    def __init__(self, schema: str = "public") -> None:
        self.schema = schema
        self._table = f"{quote_ident(schema)}.provider_quotas"

    async def configure(
        self, conn: DbConnection, name: str, per_second: float, burst: float
    ) -> None:
        """Step 1: the quota's rate and burst; a new bucket starts full."""
        await conn.execute(
            f"INSERT INTO {self._table} (name, per_second, burst, tokens)"
            " VALUES ($1, $2, $3, $3)"
            " ON CONFLICT (name) DO UPDATE SET per_second = excluded.per_second,"
            " burst = excluded.burst, tokens = least(provider_quotas.tokens, excluded.burst)"
            " WHERE (provider_quotas.per_second, provider_quotas.burst)"
            " IS DISTINCT FROM (excluded.per_second, excluded.burst)",
            name,
            per_second,
            burst,
        )

    async def take(self, conn: DbConnection, name: str, wanted: int) -> Grant | None:
        """Step 2, one statement; None: no such quota (not configured)."""
        # `now` is read before the row's lock is had: a take that waited for another's
        # finds the row refilled later than its `now`, and must neither refill nor set
        # the clock back (the time between would be counted twice).
        row = await conn.fetchrow(
            "WITH now AS (SELECT clock_timestamp() AS t),"
            " cur AS (SELECT q.name, q.per_second,"
            "  least(q.burst, q.tokens + q.per_second"
            "   * greatest(0, extract(epoch FROM now.t - q.refilled_at))) AS tokens,"
            "  greatest(0, coalesce(extract(epoch FROM q.paused_until - now.t), 0)) AS paused,"
            "  greatest(now.t, q.refilled_at) AS t"
            f"  FROM {self._table} q, now WHERE q.name = $1 FOR UPDATE OF q),"
            " got AS (SELECT cur.*, CASE WHEN paused > 0 THEN 0"
            "  ELSE least($2, floor(cur.tokens))::int END AS n FROM cur)"
            f" UPDATE {self._table} q SET tokens = got.tokens - got.n, refilled_at = got.t"
            " FROM got WHERE q.name = got.name"
            " RETURNING got.n, got.tokens - got.n, got.paused::float8, got.per_second",
            name,
            wanted,
        )
        if row is None:
            return None
        return Grant(granted=row[0], left=float(row[1]), paused_seconds=row[2], per_second=row[3])

    async def pause(self, conn: DbConnection, name: str, seconds: float) -> float | None:
        """Step 3: no send for `seconds` from now (or longer, if paused longer already);
        return the pause left, None if no such quota. Every listener is told."""
        left: float | None = await conn.fetchval(
            f"WITH paused AS (UPDATE {self._table} q SET paused_until = greatest("
            "  coalesce(q.paused_until, clock_timestamp()),"
            "  clock_timestamp() + make_interval(secs => $2))"
            "  WHERE q.name = $1"
            "  RETURNING extract(epoch FROM q.paused_until - clock_timestamp())::float8 AS left)"
            " SELECT p.left FROM paused p, pg_notify($3, json_build_object("
            "  'schema', $4::text, 'name', $1::text, 'seconds', p.left)::text)",
            name,
            seconds,
            QUOTA_CHANNEL,
            self.schema,
        )
        return left


def paused_notice(payload: str, schema: str) -> tuple[str, float] | None:
    """A QUOTA_CHANNEL payload for `schema`: (the quota's name, the seconds of pause left)."""
    try:
        notice = json.loads(payload)
        if notice.get("schema") != schema:
            return None
        return str(notice["name"]), float(notice["seconds"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
