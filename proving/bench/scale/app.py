"""The framework side of the scale runs: the bench's `framework` handler as an app.

    BENCH_QUEUE=bench.x BENCH_SCALE_DIR=/tmp/d idempotent-workers run proving.bench.scale.app:app

Read from the environment here, in a proving tool's app, never by the framework.
"""

from __future__ import annotations

import os

from consumers import App, Context
from proving.bench.sandbox import INSERT_EFFECT
from proving.bench.scale.instrument import install_from_env

install_from_env()

app = App()


@app.handler(os.environ.get("BENCH_QUEUE", "bench.scale"))
async def record(ctx: Context) -> None:
    body = ctx.body
    await ctx.stage(
        INSERT_EFFECT,
        ctx.consumer,
        ctx.tenant,
        ctx.message_id,
        body["order_id"],
        body["total_cents"],
    )
