"""Issue 9, case 3: credentials or configuration refused fail no push; the provider is
paused with one loud error, exposed, probed, and resumes on its own."""

from __future__ import annotations

import pytest
import structlog

from consumers import App, CircuitState, Publisher, Settings, Worker, push_job_body
from dedupe import DbConnection
from providers import ApnsProvider, FcmProvider, Platform, PlatformRouter, Provider, Target
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.fcm import FakeFcm, FcmReply
from tests.apps.push_app import FAST_RETRY
from tests.support import wait_for

JOBS = 20
PROBE = 0.5


@pytest.mark.parametrize("platform", [Platform.IOS, Platform.ANDROID])
async def test_refused_credentials_pause_the_provider_fail_no_push_and_a_probe_resumes_it(
    platform: Platform,
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
) -> None:
    ios = platform is Platform.IOS
    provider_name = "apns" if ios else "fcm"
    if ios:
        fake_apns.unscripted = ApnsReply(status=403, reason="InvalidProviderToken")
    else:
        fake_fcm.unscripted = FcmReply(status=403, error_code="PERMISSION_DENIED")
    requests = fake_apns.requests if ios else fake_fcm.requests
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return PlatformRouter(
            apns=ApnsProvider(fake_apns.settings(timeout_seconds=5.0)),
            fcm=FcmProvider(fake_fcm.settings(timeout_seconds=5.0)),
        )

    app.push_handler(queue_name, provider=provider, probe_seconds=PROBE)
    with structlog.testing.capture_logs() as logs:
        async with Worker(app, settings) as worker:
            for n in range(JOBS):
                device = Target(platform=platform, token=f"device-{n:04d}-xxxx")
                body = push_job_body(targets=[device], body="x")
                await publisher.publish(queue_name, body, message_id=f"job-{n}")

            async def paused_and_probed() -> bool:
                views = {v.provider: v for v in worker.provider_circuits()}
                view = views.get(provider_name)
                probes = sum(e["event"] == "provider_probe_refused" for e in logs)
                return view is not None and view.state is not CircuitState.CLOSED and probes >= 2

            await wait_for(paused_and_probed)
            [view] = [v for v in worker.provider_circuits() if v.provider == provider_name]
            assert view.reason == ("InvalidProviderToken" if ios else "PERMISSION_DENIED")
            assert not await _any_failed(db)
            refused = len(requests)
            assert refused < JOBS + 10  # paused: probes only, not every job again and again

            # Someone fixes the key: the next probe succeeds and everything is sent.
            if ios:
                fake_apns.unscripted = ApnsReply()
            else:
                fake_fcm.unscripted = FcmReply()
            await wait_for(lambda: _all_sent(db, JOBS), timeout=60)
            assert {v.state for v in worker.provider_circuits()} == {CircuitState.CLOSED}
    paused = [e for e in logs if e["event"] == "provider_paused"]
    assert len(paused) == 1
    assert paused[0]["log_level"] == "error"
    assert paused[0]["provider"] == provider_name
    assert [e["event"] for e in logs].count("provider_resumed") == 1
    assert not await _any_failed(db)


async def _any_failed(db: DbConnection) -> bool:
    return bool(await db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'failed'"))


async def _all_sent(db: DbConnection, n: int) -> bool:
    sent = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
    return bool(sent >= n)
