"""Local fake APNs, FCM, Web Push and SMTP servers, a webhook receiver and a payments API
that keeps idempotency keys as Stripe documents, for your tests and demos: never Apple,
Google, a browser vendor, a mail server, a payments provider or anyone's endpoint.

```python
from providers.fakes import FakeApns

async with FakeApns() as apns:
    apns.script("dead-token", status=410)
    provider = ApnsProvider(apns.settings())
```

With pytest, load the plugin (`pytest_plugins = ["providers.fakes.pytest_plugin"]`
in your conftest.py, or `-p providers.fakes.pytest_plugin`) for the fixtures
`fake_apns`, `fake_fcm`, `fake_webpush`, `webhook_receiver`, `fake_smtp` and
`fake_payments`. Three load on first use: the receiver (`providers.fakes.webhooks`, the
`webhooks` extra), `FakeSmtp` (aiosmtpd, the dev group) and `FakePayments` (uvicorn, the
`serve` extra).
"""

from typing import TYPE_CHECKING, Any

from providers.fakes.apns import ApnsReply, ApnsRequest, FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env, router_from_env
from providers.fakes.fcm import FakeFcm, FcmReply, FcmRequest
from providers.fakes.ratelimit import FakeRateLimit
from providers.fakes.webpush import (
    FakeSubscription,
    FakeWebPush,
    PendingMessage,
    WebPushReply,
    WebPushRequest,
)

if TYPE_CHECKING:
    from providers.fakes.payments import FakePayments, PaymentsRequest, PaymentsScript
    from providers.fakes.smtp import FakeSmtp, SmtpMessage, SmtpScript
    from providers.fakes.webhooks import ReceivedWebhook, ReceiverReply, WebhookReceiver

_LAZY = {
    "FakePayments": "providers.fakes.payments",
    "PaymentsRequest": "providers.fakes.payments",
    "PaymentsScript": "providers.fakes.payments",
    "FakeSmtp": "providers.fakes.smtp",
    "SmtpMessage": "providers.fakes.smtp",
    "SmtpScript": "providers.fakes.smtp",
    "ReceivedWebhook": "providers.fakes.webhooks",
    "ReceiverReply": "providers.fakes.webhooks",
    "WebhookReceiver": "providers.fakes.webhooks",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'providers.fakes' has no attribute {name!r}")


__all__ = [
    "ApnsReply",
    "ApnsRequest",
    "FakeApns",
    "FakeFcm",
    "FakePayments",
    "FakeRateLimit",
    "FakeSmtp",
    "FakeSubscription",
    "FakeWebPush",
    "FcmReply",
    "FcmRequest",
    "PaymentsRequest",
    "PaymentsScript",
    "PendingMessage",
    "ReceivedWebhook",
    "ReceiverReply",
    "SmtpMessage",
    "SmtpScript",
    "WebPushReply",
    "WebPushRequest",
    "WebhookReceiver",
    "collapse_ids_sent",
    "fakes_env",
    "router_from_env",
]
