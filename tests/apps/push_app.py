"""The push app the process tests run, pointed at fakes the test process serves.

The test passes where the fakes listen (and the APNs signing key, as a file)
in the environment; `pruned_devices` records what `on_invalid_token` saw.
"""

from __future__ import annotations

import os

from consumers import App, DeadTarget, RetryPolicy, UnknownOutcome
from dedupe import DbConnection
from providers import Provider
from providers.fakes.env import router_from_env
from proving.faults import SigkillAt

FAST_RETRY = RetryPolicy(max_attempts=5, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0, 2.0))

app = App(retry=FAST_RETRY, faults=SigkillAt.from_env(os.environ))


async def build_provider() -> Provider:
    timeout = float(os.environ.get("TEST_PROVIDER_TIMEOUT", "5"))
    return router_from_env(os.environ, "TEST_", timeout_seconds=timeout)


async def prune(tx: DbConnection, dead: DeadTarget) -> None:
    await tx.execute(
        "INSERT INTO pruned_devices (token, reason, worker_pid) VALUES ($1, $2, $3)",
        dead.address,
        dead.reason,
        os.getpid(),
    )


app.push_handler(
    os.environ.get("TEST_QUEUE", "pushes"),
    provider=build_provider,
    on_invalid_token=prune,
    unknown_outcome=UnknownOutcome(os.environ.get("TEST_UNKNOWN_OUTCOME", "resend")),
    lease_seconds=float(os.environ.get("TEST_LEASE_SECONDS", "10")),
)
