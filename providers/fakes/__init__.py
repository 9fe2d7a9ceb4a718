"""Local fake APNs, FCM and Web Push servers and a webhook receiver, for your tests and
demos: never Apple, Google, a browser vendor or anyone's endpoint.

```python
from providers.fakes import FakeApns

async with FakeApns() as apns:
    apns.script("dead-token", status=410)
    provider = ApnsProvider(apns.settings())
```

With pytest, load the plugin (`pytest_plugins = ["providers.fakes.pytest_plugin"]`
in your conftest.py, or `-p providers.fakes.pytest_plugin`) for the fixtures
`fake_apns`, `fake_fcm`, `fake_webpush` and `webhook_receiver`. The receiver
(`providers.fakes.webhooks`) loads on first use: it needs the `webhooks` extra.
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
    from providers.fakes.webhooks import ReceivedWebhook, ReceiverReply, WebhookReceiver

_LAZY = frozenset({"ReceivedWebhook", "ReceiverReply", "WebhookReceiver"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module("providers.fakes.webhooks"), name)
    raise AttributeError(f"module 'providers.fakes' has no attribute {name!r}")


__all__ = [
    "ApnsReply",
    "ApnsRequest",
    "FakeApns",
    "FakeFcm",
    "FakeRateLimit",
    "FakeSubscription",
    "FakeWebPush",
    "FcmReply",
    "FcmRequest",
    "PendingMessage",
    "ReceivedWebhook",
    "ReceiverReply",
    "WebPushReply",
    "WebPushRequest",
    "WebhookReceiver",
    "collapse_ids_sent",
    "fakes_env",
    "router_from_env",
]
