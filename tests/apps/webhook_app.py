"""The webhook app the process tests run, sending to a receiver the test process serves.

The key (IW_WEBHOOK_SECRETS_KEY) and the http allow-list (IW_WEBHOOK_ALLOW_HTTP_HOSTS)
come from the environment the test gives the process, as in production.
"""

from __future__ import annotations

import os

from consumers import App, RetryPolicy, WebhookSettings

FAST_RETRY = RetryPolicy(max_attempts=5, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0, 2.0))

app = App(retry=FAST_RETRY)

app.webhook_handler(
    os.environ.get("TEST_QUEUE", "webhooks"),
    settings=WebhookSettings(
        allow_http_hosts=frozenset({"127.0.0.1"}),
        timeout_seconds=float(os.environ.get("TEST_WEBHOOK_TIMEOUT", "5")),
        connect_timeout_seconds=1.0,
        max_in_flight=int(os.environ.get("TEST_MAX_IN_FLIGHT", "16")),
    ),
    lease_seconds=float(os.environ.get("TEST_LEASE_SECONDS", "10")),
)
