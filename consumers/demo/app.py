"""The demo's worker: one order-shipped effect per job.

`demo_effects` has no unique constraint on purpose, so the demo's report
would show a doubled effect as two rows rather than hide it behind an error.
"""

from __future__ import annotations

from consumers.app import App
from consumers.context import Context

QUEUE = "demo.orders.shipped"

app = App()


@app.handler(QUEUE)
async def record_shipment(ctx: Context) -> None:
    await ctx.stage(
        "INSERT INTO demo_effects (tenant, message_id, order_id) VALUES ($1, $2, $3)",
        ctx.tenant,
        ctx.message_id,
        ctx.body["order_id"],
    )
