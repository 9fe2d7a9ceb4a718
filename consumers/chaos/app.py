"""The worker app the chaos run starts: local effects, and poison.

    chaos.local    one row in `chaos_effects` per job, staged (executemany)
    chaos.poison   always raises: retried on short tiers, dead-lettered after
                   POISON_MAX_ATTEMPTS attempts

`chaos_effects` has no unique constraint on purpose: a doubled effect shows
up as a second row for the same key instead of being hidden by an error.
"""

from __future__ import annotations

import os

from consumers.app import App
from consumers.context import Context
from consumers.retry import RetryPolicy

LOCAL_QUEUE = "chaos.local"
POISON_QUEUE = "chaos.poison"
POISON_MAX_ATTEMPTS = 5

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS chaos_effects (
    id          bigserial PRIMARY KEY,
    tenant      text NOT NULL,
    message_id  text NOT NULL,
    worker_pid  integer NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)"""

# The default five attempts, on tiers short enough for a run; the poison queue's tiers are short
# so that a message that can never succeed is dead-lettered well within 60 s.
LOCAL_RETRY = RetryPolicy(base_seconds=0.5, tiers_seconds=(0.5, 2.0, 8.0))
POISON_RETRY = RetryPolicy(
    max_attempts=POISON_MAX_ATTEMPTS, base_seconds=0.5, tiers_seconds=(0.5, 1.0, 2.0, 4.0)
)


class PoisonError(Exception):
    """What the poison handler raises, every time."""


app = App()


@app.handler(LOCAL_QUEUE, retry=LOCAL_RETRY)
async def apply_local(ctx: Context) -> None:
    await ctx.stage(
        "INSERT INTO chaos_effects (tenant, message_id, worker_pid) VALUES ($1, $2, $3)",
        ctx.tenant,
        ctx.message_id,
        os.getpid(),
    )


@app.handler(POISON_QUEUE, retry=POISON_RETRY)
async def always_fail(ctx: Context) -> None:
    raise PoisonError(f"poison job {ctx.message_id} never succeeds")
