"""The demo's workers: one order-shipped effect per job, push notifications and webhooks.

Every tenth order also emits a follow-up push job ("your order shipped") with
`ctx.emit`: written to the outbox in the effect's transaction, published by
the relay the workers run beside their handlers (IW_RELAY=1), sent by the
push queue's handler. The chain holds end to end: one push per order effect.
Every fourth order emits an `order.shipped` webhook job the same way, sent by
the webhook queue's handler to the tenant's endpoints (registered by the demo
with the real endpoint store; the key that keeps their secrets encrypted,
IW_WEBHOOK_SECRETS_KEY, is made for the run and given to the workers), and
every fifth an e-mail to its customer, sent over SMTP to the demo's SMTP
server (aiosmtpd) by the e-mail queue's handler.

`demo_effects` has no unique constraint on purpose, so the demo's report
would show a doubled effect as two rows rather than hide it behind an error.
The push queue sends to the local fake APNs, FCM and Web Push services the demo starts;
the e-mail queue to its SMTP server;
where they listen comes in the worker's environment (DEMO_* variables), read
when the worker builds its provider, not at import.
"""

from __future__ import annotations

import os
from typing import Any

from consumers import (
    EMAIL,
    App,
    Context,
    DeadTarget,
    RetryPolicy,
    WebhookSettings,
    email_job_body,
    push_job_body,
    webhook_job_body,
)
from dedupe import DbConnection
from providers import Platform, Provider, Sender, SmtpSettings, SmtpTls, Target
from proving.deadlines import ANSWER_S

QUEUE = "demo.orders.shipped"
PUSH_QUEUE = "demo.notifications"
WEBHOOK_QUEUE = "demo.webhooks"
WEBHOOK_EVENT = "order.shipped"
EMAIL_QUEUE = "demo.emails"
# Retries within seconds, not minutes: a job whose rows the SIGKILLed worker holds
# comes back as soon as their lease (SEND_LEASE_S) has expired, and is resent then.
SHORT_RETRY = RetryPolicy(max_attempts=6, base_seconds=0.5, tiers_seconds=(0.5, 1.0, 2.0, 4.0, 8.0))
# Far above the fakes' answer time, even on a machine busy with other work: a
# timeout is an unknown outcome, which the demo counts as a defect.
PROVIDER_TIMEOUT_S = 10.0
SEND_LEASE_S = 25.0  # past the providers' whole answer time, with room to record it

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
    if sends_webhook(order_id):
        await ctx.emit(
            WEBHOOK_QUEUE,
            webhook_job_body(
                event_type=WEBHOOK_EVENT,
                payload={"order": order_id, "carrier": ctx.body["carrier"]},
            ),
            message_id=f"{ctx.message_id}:webhook",
        )
    if sends_email(order_id):
        await ctx.emit(
            EMAIL_QUEUE,
            email_job_body(
                to=[customer_address(order_id)],
                subject=f"Order {order_id} shipped",
                text=f"Your order {order_id} is on its way with {ctx.body['carrier']}.",
            ),
            message_id=f"{ctx.message_id}:email",
        )


def follows_up(order_id: int) -> bool:
    """Orders whose effect emits a follow-up push job."""
    return order_id % 10 == 0


def sends_webhook(order_id: int) -> bool:
    """Orders whose effect emits an `order.shipped` webhook job."""
    return order_id % 4 == 0


def sends_email(order_id: int) -> bool:
    """Orders whose effect emits an e-mail to the customer."""
    return order_id % 5 == 0


def customer_address(order_id: int) -> str:
    return f"customer-{order_id}@example.com"


def smtp_settings(port: int) -> SmtpSettings:
    """The demo's SMTP server on this machine, in plain text (allowed to loopback only)."""
    return SmtpSettings(
        host="127.0.0.1",
        port=port,
        tls=SmtpTls.NONE,
        default_from="Shop <shop@example.com>",
        timeout_seconds=PROVIDER_TIMEOUT_S,
        connect_timeout_seconds=3.0,
    )


async def smtp_sender() -> Sender[Any]:
    """The SMTP sender, pointed at the demo's server (DEMO_SMTP_PORT)."""
    from providers.smtp import SmtpSender

    return SmtpSender(smtp_settings(int(os.environ["DEMO_SMTP_PORT"])))


def follow_up_body(order_id: int) -> dict[str, Any]:
    platform = (Platform.IOS, Platform.ANDROID, Platform.WEB)[order_id % 3]
    return push_job_body(
        targets=[Target(platform=platform, token=f"followup-{order_id:06d}")],
        title="Shipped",
        body=f"Order {order_id} is on its way",
        data={"order": str(order_id)},
    )


async def fake_providers() -> Provider:
    """APNs, FCM and Web Push providers pointed at the demo's fakes."""
    from providers.fakes.env import router_from_env

    return router_from_env(os.environ, "DEMO_", timeout_seconds=PROVIDER_TIMEOUT_S)


async def prune_device(tx: DbConnection, dead: DeadTarget) -> None:
    """Runs once per dead token, in the transaction that records the failure."""
    await tx.execute("DELETE FROM demo_devices WHERE token = $1", dead.address, timeout=ANSWER_S)
    await tx.execute(
        "INSERT INTO demo_pruned (token, reason) VALUES ($1, $2)",
        dead.address,
        dead.reason,
        timeout=ANSWER_S,
    )


app.push_handler(
    PUSH_QUEUE,
    provider=fake_providers,
    on_invalid_token=prune_device,
    lease_seconds=SEND_LEASE_S,
    retry=SHORT_RETRY,
)
# The endpoints are the demo's receiver on 127.0.0.1 (plain http allowed there only);
# the key their secrets are encrypted under comes from the worker's environment.
app.webhook_handler(
    WEBHOOK_QUEUE,
    settings=WebhookSettings(
        allow_http_hosts=frozenset({"127.0.0.1"}),
        timeout_seconds=PROVIDER_TIMEOUT_S,
        connect_timeout_seconds=3.0,
    ),
    lease_seconds=SEND_LEASE_S,
    retry=SHORT_RETRY,
)
# `App.email_handler` with its settings made when the worker builds its sender: where
# the demo's SMTP server listens is known then, from the environment.
app.effect_handler(
    EMAIL_QUEUE, kind=EMAIL, provider=smtp_sender, lease_seconds=SEND_LEASE_S, retry=SHORT_RETRY
)
