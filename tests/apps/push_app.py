"""The push app the process tests run, pointed at fakes the test process serves.

The test passes where the fakes listen (and the APNs signing key, as a file)
in the environment; `pruned_devices` records what `on_invalid_token` saw.
"""

from __future__ import annotations

import os
from pathlib import Path

from consumers import App, DeadToken, RetryPolicy, UnknownOutcome
from dedupe import DbConnection
from providers import ApnsProvider, ApnsSettings, FcmProvider, FcmSettings, PlatformRouter, Provider

FAST_RETRY = RetryPolicy(max_attempts=5, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0, 2.0))

app = App(retry=FAST_RETRY)


async def build_provider() -> Provider:
    env = os.environ
    key = Path(env["TEST_APNS_KEY_FILE"]).read_text()  # noqa: ASYNC240 - once, at start
    apns = ApnsProvider(
        ApnsSettings(
            topic="com.example.app",
            key=key,
            key_id="FAKEKEY123",
            team_id="FAKETEAM12",
            host="127.0.0.1",
            port=int(env["TEST_APNS_PORT"]),
            ca_file=env["TEST_APNS_CA_FILE"],
            timeout_seconds=float(env.get("TEST_PROVIDER_TIMEOUT", "5")),
        )
    )
    fcm = FcmProvider(
        FcmSettings(
            credentials=env["TEST_FCM_SERVICE_ACCOUNT"],
            project_id=env["TEST_FCM_PROJECT"],
            base_url=env["TEST_FCM_BASE_URL"],
            timeout_seconds=float(env.get("TEST_PROVIDER_TIMEOUT", "5")),
        )
    )
    return PlatformRouter(apns=apns, fcm=fcm)


async def prune(tx: DbConnection, dead: DeadToken) -> None:
    await tx.execute(
        "INSERT INTO pruned_devices (token, reason, worker_pid) VALUES ($1, $2, $3)",
        dead.token,
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
