"""Local fake APNs and FCM servers, for your tests and demos: never Apple or Google.

```python
from providers.fakes import FakeApns

async with FakeApns() as apns:
    apns.script("dead-token", status=410)
    provider = ApnsProvider(apns.settings())
```

With pytest, load the plugin (`pytest_plugins = ["providers.fakes.pytest_plugin"]`
in your conftest.py, or `-p providers.fakes.pytest_plugin`) for the fixtures
`fake_apns` and `fake_fcm`.
"""

from providers.fakes.apns import ApnsReply, ApnsRequest, FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env, router_from_env
from providers.fakes.fcm import FakeFcm, FcmReply, FcmRequest
from providers.fakes.ratelimit import FakeRateLimit

__all__ = [
    "ApnsReply",
    "ApnsRequest",
    "FakeApns",
    "FakeFcm",
    "FakeRateLimit",
    "FcmReply",
    "FcmRequest",
    "collapse_ids_sent",
    "fakes_env",
    "router_from_env",
]
