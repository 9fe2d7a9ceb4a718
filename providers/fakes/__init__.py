"""Local fake servers, for your tests and demos: never Apple, Google, a mail server or a
payments provider. APNs and FCM; an SMTP server (`FakeSmtp`, on aiosmtpd); a payments
API that keeps idempotency keys as Stripe documents (`FakePayments`, uvicorn). The
last two load on first use (aiosmtpd comes with the dev group, uvicorn with `serve`).

```python
from providers.fakes import FakeApns

async with FakeApns() as apns:
    apns.script("dead-token", status=410)
    provider = ApnsProvider(apns.settings())
```

With pytest, load the plugin (`pytest_plugins = ["providers.fakes.pytest_plugin"]`
in your conftest.py, or `-p providers.fakes.pytest_plugin`) for the fixtures
`fake_apns`, `fake_fcm`, `fake_smtp` and `fake_payments`.
"""

from typing import TYPE_CHECKING, Any

from providers.fakes.apns import ApnsReply, ApnsRequest, FakeApns
from providers.fakes.env import collapse_ids_sent, fakes_env, router_from_env
from providers.fakes.fcm import FakeFcm, FcmReply, FcmRequest

if TYPE_CHECKING:
    from providers.fakes.payments import FakePayments, PaymentsRequest, PaymentsScript
    from providers.fakes.smtp import FakeSmtp, SmtpMessage, SmtpScript

_LAZY = {
    "FakePayments": "providers.fakes.payments",
    "PaymentsRequest": "providers.fakes.payments",
    "PaymentsScript": "providers.fakes.payments",
    "FakeSmtp": "providers.fakes.smtp",
    "SmtpMessage": "providers.fakes.smtp",
    "SmtpScript": "providers.fakes.smtp",
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
    "FakeSmtp",
    "FcmReply",
    "FcmRequest",
    "PaymentsRequest",
    "PaymentsScript",
    "SmtpMessage",
    "SmtpScript",
    "collapse_ids_sent",
    "fakes_env",
    "router_from_env",
]
