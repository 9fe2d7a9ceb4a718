"""The API app the process tests run, pointed at the fake payments API the test serves.

`TEST_PAYMENTS_URL` says where the fake listens; `TEST_API` which way the API
recovers (`payments`: replays by key; `payments_lookup`: asked by key first);
`TEST_WINDOW_SECONDS` shortens the replay window to the fake's own.
"""

from __future__ import annotations

import os

from consumers import App, RetryPolicy
from providers import ApiSettings, replays_within
from proving.faults import SigkillAt
from tests.apps.payments import LookedUpPaymentsApi, PaymentsApi

FAST_RETRY = RetryPolicy(max_attempts=5, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0, 2.0))

app = App(retry=FAST_RETRY, faults=SigkillAt.from_env(os.environ))


class ShortWindowPaymentsApi(PaymentsApi):
    """PaymentsApi whose provider keeps a key as long as the test's fake does."""

    recovery = replays_within(float(os.environ.get("TEST_WINDOW_SECONDS", "86400")))


APIS: dict[str, type[PaymentsApi]] = {
    "payments": ShortWindowPaymentsApi,
    "payments_lookup": LookedUpPaymentsApi,
}

if "TEST_PAYMENTS_URL" in os.environ:
    timeout = float(os.environ.get("TEST_API_TIMEOUT", "5"))
    app.api_handler(
        os.environ.get("TEST_QUEUE", "charges"),
        api=APIS[os.environ.get("TEST_API", "payments")],
        settings=ApiSettings(
            base_url=os.environ["TEST_PAYMENTS_URL"],
            timeout_seconds=timeout,
            connect_timeout_seconds=min(1.0, timeout),
        ),
        lease_seconds=float(os.environ.get("TEST_LEASE_SECONDS", "10")),
    )
