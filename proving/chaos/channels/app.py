"""The worker apps of the channel profiles: one queue each, sending to the run's fakes.

    proving.chaos.channels.app:webhooks   chaos.webhooks: webhook jobs, signed per the
                                          Standard Webhooks specification, to the
                                          endpoints the run registered
    proving.chaos.channels.app:webpush    chaos.webpush: push jobs of Web Push
                                          subscriptions, to the run's push service
    proving.chaos.channels.app:email      chaos.email: e-mail jobs over SMTP, to the
                                          run's SMTP server (aiosmtpd)
    proving.chaos.channels.app:api        chaos.api: charges with an Idempotency-Key,
                                          to the run's Stripe-like payments API;
                                          replayed by key after a crash
    proving.chaos.channels.app:api_lookup chaos.api: the same, asked by key first

Where the fakes listen comes in CHAOS_* variables, read when the worker builds
its sender; the webhook key (IW_WEBHOOK_SECRETS_KEY) as in production. Every app
has the fault seam armed (`PROVING_CRASH_AT=after_send`: the chaos fleet makes
some starts kill themselves between a provider's answer and its record).
"""

from __future__ import annotations

import os
from typing import Any

from consumers import EMAIL, App, RetryPolicy, WebhookSettings
from providers import ApiSettings, Provider, Sender, SmtpSettings, SmtpTls
from proving.chaos.channels.payments import LookedUpPayments, Payments
from proving.faults import SigkillAt

WEBHOOK_QUEUE = "chaos.webhooks"
WEBPUSH_QUEUE = "chaos.webpush"
EMAIL_QUEUE = "chaos.email"
API_QUEUE = "chaos.api"
# A call's whole answer time, far above the fakes' latency even on a machine loaded
# by other work (a timeout is an unknown outcome: sent again, counted apart from the
# kills); the lease leaves it room, so no send starts that could outlive its lease.
SEND_TIMEOUT_S = 10.0
SEND_LEASE_S = 25.0
# Short tiers: a job a killed worker held comes back once its lease expired, and a
# receiver's 503 or 429 is retried within seconds.
RETRY = RetryPolicy(max_attempts=8, base_seconds=0.5, tiers_seconds=(0.5, 1.0, 2.0, 4.0, 8.0))


def _app() -> App:
    return App(faults=SigkillAt.from_env(os.environ))  # armed by the chaos fleet


async def web_push() -> Provider:
    """The router, its Web Push provider pointed at the run's push service."""
    from providers.fakes.env import router_from_env

    return router_from_env(os.environ, "CHAOS_", timeout_seconds=SEND_TIMEOUT_S)


def smtp_settings(port: int) -> SmtpSettings:
    """The sender's settings: the run's SMTP server on this machine, in plain text."""
    return SmtpSettings(
        host="127.0.0.1",
        port=port,
        tls=SmtpTls.NONE,  # allowed to loopback only
        default_from="Shop <shop@example.com>",
        timeout_seconds=SEND_TIMEOUT_S,
        connect_timeout_seconds=3.0,
        max_in_flight=16,
    )


async def smtp_sender() -> Sender[Any]:
    from providers.smtp import SmtpSender  # aiosmtplib: the `mail` extra

    return SmtpSender(smtp_settings(int(os.environ["CHAOS_SMTP_PORT"])))


def api_settings() -> ApiSettings:
    return ApiSettings(
        base_url=os.environ["CHAOS_PAYMENTS_URL"],
        timeout_seconds=SEND_TIMEOUT_S,
        connect_timeout_seconds=3.0,
        max_in_flight=32,
    )


async def payments() -> Payments:
    return Payments(api_settings())


async def looked_up_payments() -> LookedUpPayments:
    return LookedUpPayments(api_settings())


webhooks = _app()
webhooks.webhook_handler(
    WEBHOOK_QUEUE,
    settings=WebhookSettings(
        allow_http_hosts=frozenset({"127.0.0.1"}),
        timeout_seconds=SEND_TIMEOUT_S,
        connect_timeout_seconds=3.0,
    ),
    lease_seconds=SEND_LEASE_S,
    retry=RETRY,
)

webpush = _app()
webpush.push_handler(WEBPUSH_QUEUE, provider=web_push, lease_seconds=SEND_LEASE_S, retry=RETRY)

email = _app()
email.effect_handler(
    EMAIL_QUEUE, kind=EMAIL, provider=smtp_sender, lease_seconds=SEND_LEASE_S, retry=RETRY
)

api = _app()
api.api_handler(API_QUEUE, api=Payments, build=payments, lease_seconds=SEND_LEASE_S, retry=RETRY)

api_lookup = _app()
api_lookup.api_handler(
    API_QUEUE,
    api=LookedUpPayments,
    build=looked_up_payments,
    lease_seconds=SEND_LEASE_S,
    retry=RETRY,
)

APPS = {
    "webhooks": webhooks,
    "webpush": webpush,
    "email": email,
    "api": api,
    "api_lookup": api_lookup,
}
