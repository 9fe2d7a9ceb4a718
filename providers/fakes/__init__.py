"""Local fake APNs, FCM and Web Push servers, for your tests and demos: never the real ones.

```python
from providers.fakes import FakeApns

async with FakeApns() as apns:
    apns.script("dead-token", status=410)
    provider = ApnsProvider(apns.settings())
```

With pytest, load the plugin (`pytest_plugins = ["providers.fakes.pytest_plugin"]`
in your conftest.py, or `-p providers.fakes.pytest_plugin`) for the fixtures
`fake_apns`, `fake_fcm` and `fake_webpush`.
"""

from providers.fakes.apns import ApnsReply, ApnsRequest, FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env, router_from_env
from providers.fakes.fcm import FakeFcm, FcmReply, FcmRequest
from providers.fakes.webpush import (
    FakeSubscription,
    FakeWebPush,
    PendingMessage,
    WebPushReply,
    WebPushRequest,
)

__all__ = [
    "ApnsReply",
    "ApnsRequest",
    "FakeApns",
    "FakeFcm",
    "FakeSubscription",
    "FakeWebPush",
    "FcmReply",
    "FcmRequest",
    "PendingMessage",
    "WebPushReply",
    "WebPushRequest",
    "collapse_ids_sent",
    "fakes_env",
    "router_from_env",
]
