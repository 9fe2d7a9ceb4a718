"""The worker app the fuzz run starts: one row in `fuzz_effects` per decoded input.

The queue comes in `FUZZ_QUEUE`, read here at import by the worker process
the run starts (never by the framework).
"""

from __future__ import annotations

import os

from consumers import App, Context, RetryPolicy

EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS fuzz_effects (
    id          bigserial PRIMARY KEY,
    tenant      text NOT NULL,
    message_id  text NOT NULL
)"""

RETRY = RetryPolicy(max_attempts=3, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0))

app = App(retry=RETRY)


@app.handler(os.environ.get("FUZZ_QUEUE", "fuzz.inputs"), retry=RETRY)
async def record(ctx: Context) -> None:
    await ctx.stage(
        "INSERT INTO fuzz_effects (tenant, message_id) VALUES ($1, $2)",
        ctx.tenant,
        ctx.message_id,
    )
