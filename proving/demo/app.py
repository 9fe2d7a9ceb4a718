"""The demo's workers: one order-shipped effect per job, and push notifications.

Every tenth order also emits a follow-up push job ("your order shipped") with
`ctx.emit`: written to the outbox in the effect's transaction, published by
the relay the workers run beside their handlers (IW_RELAY=1), sent by the
push queue's handler. The chain holds end to end: one push per order effect.

`demo_effects` has no unique constraint on purpose, so the demo's report
would show a doubled effect as two rows rather than hide it behind an error.
The push queue sends to the local fake APNs and FCM servers the demo starts;
where they listen comes in the worker's environment (DEMO_* variables), read
when the worker builds its provider, not at import.
"""

from __future__ import annotations

import os
from typing import Any

from consumers import App, Context, DeadTarget, push_job_body
from dedupe import DbConnection
from providers import Platform, Provider, Target
from proving.deadlines import ANSWER_S

QUEUE = "demo.orders.shipped"
PUSH_QUEUE = "demo.notifications"

app = App()


@app.handler(QUEUE)
async def record_shipment(ctx: Context) -> None:
    await ctx.stage(
        "INSERT INTO demo_effects (tenant, message_id, order_id) VALUES ($1, $2, $3)",
        ctx.tenant,
        ctx.message_id,
        ctx.body["order_id"],
    )
    order_id = ctx.body["order_id"]
    if follows_up(order_id):
        await ctx.emit(
            PUSH_QUEUE,
            follow_up_body(order_id),
            message_id=f"{ctx.message_id}:push",  # one id per order, however often it is tried
        )


def follows_up(order_id: int) -> bool:
    """Orders whose effect emits a follow-up push job."""
    return order_id % 10 == 0


def follow_up_body(order_id: int) -> dict[str, Any]:
    platform = (Platform.IOS, Platform.ANDROID, Platform.WEB)[order_id % 3]
    return push_job_body(
        targets=[Target(platform=platform, token=f"followup-{order_id:06d}")],
        title="Shipped",
        body=f"Order {order_id} is on its way",
        data={"order": str(order_id)},
    )


async def fake_providers() -> Provider:
    """APNs and FCM providers pointed at the demo's fakes."""
    from providers.fakes.env import router_from_env

    return router_from_env(os.environ, "DEMO_", timeout_seconds=5.0)


async def prune_device(tx: DbConnection, dead: DeadTarget) -> None:
    """Runs once per dead token, in the transaction that records the failure."""
    await tx.execute("DELETE FROM demo_devices WHERE token = $1", dead.address, timeout=ANSWER_S)
    await tx.execute(
        "INSERT INTO demo_pruned (token, reason) VALUES ($1, $2)",
        dead.address,
        dead.reason,
        timeout=ANSWER_S,
    )


app.push_handler(PUSH_QUEUE, provider=fake_providers, on_invalid_token=prune_device)
