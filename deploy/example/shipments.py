"""The example app the deploy/ image runs: replace it with your own module.

Its table is your app's to create (deploy/example/schema.sql; compose runs
it when PostgreSQL starts empty); `idempotent-workers migrate` creates only
the framework's own tables.
"""

from __future__ import annotations

from consumers import App, Context

app = App()


@app.handler("orders.shipped")
async def record_shipment(ctx: Context) -> None:
    await ctx.tx.execute(
        "INSERT INTO shipments (order_id, tenant) VALUES ($1, $2)", ctx.body["order_id"], ctx.tenant
    )
