"""Issue 22: a push job whose sends take longer than one lease is still delivered.

The scenario of the issue as a new user met it: 400 Android devices, FCM
answering after 1.5 s, `FcmSettings` timeout 4 s (connect at its default 3 s),
lease 6 s, two workers holding one delivery each. 32 FCM connections (the
default was 32 threads then) need about 19 s for the job, three leases: the
worker holding it must extend its leases as it goes, and every device gets
exactly one POST.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from consumers import App, Publisher, Settings, Worker, push_job_body
from consumers.effects.lease import LeaseTooShort, check_lease, usable_seconds
from dedupe import DbConnection
from providers import ApnsProvider, FcmProvider, Platform, PlatformRouter, Provider, Target
from providers.fakes.apns import FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm, FcmReply
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness
from tests.support import WorkerProcess, wait_for

DEVICES = 400
LATENCY = 1.5
TIMEOUT = 4.0
LEASE = 6.0
IN_FLIGHT = 32  # at the default 100, the job would take one lease


async def test_a_job_longer_than_its_lease_sends_every_device_once(
    db: DbConnection, queue_name: str, publisher: Publisher, settings: Settings
) -> None:
    async with FakeFcm() as fcm:
        fcm.unscripted = FcmReply(latency=LATENCY)
        app = App(retry=FAST_RETRY)

        async def provider() -> Provider:
            return FcmProvider(fcm.settings(timeout_seconds=TIMEOUT, max_connections=IN_FLIGHT))

        app.push_handler(queue_name, provider=provider, lease_seconds=LEASE)
        targets = [
            Target(platform=Platform.ANDROID, token=f"dev-{n:04d}-xx") for n in range(DEVICES)
        ]
        one = replace(settings, worker=replace(settings.worker, push_prefetch=1))
        async with Worker(app, one), Worker(app, one):
            await publisher.publish(
                queue_name, push_job_body(targets=targets, body="Sale"), message_id="sale-1"
            )
            # 400 / 32 in flight * 1.5 s = 19 s of sending; the rest is a generous margin.
            await wait_for(lambda: _settled(db, DEVICES), timeout=90)
        statuses = await db.fetch("SELECT status, count(*) AS n FROM send_ledger GROUP BY 1")
        assert {r["status"]: r["n"] for r in statuses} == {"sent": DEVICES}
        posts = Counter(r.token for r in fcm.requests)
        assert set(posts) == {t.token for t in targets}
        assert max(posts.values()) == 1, f"{sum(n > 1 for n in posts.values())} sent twice"


async def _settled(db: DbConnection, n: int) -> bool:
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')")
    return bool(done >= n)


# --- one rule, checked at start --------------------------------------------


@pytest.mark.parametrize("platform", [Platform.ANDROID, Platform.IOS])
async def test_the_least_lease_a_worker_accepts_is_one_under_which_sends_start(
    platform: Platform, harness: Harness, fake_apns: FakeApns, fake_fcm: FakeFcm
) -> None:
    timeout = 1.0
    router = PlatformRouter(
        apns=ApnsProvider(fake_apns.settings(timeout_seconds=timeout)),
        fcm=FcmProvider(fake_fcm.settings(timeout_seconds=timeout)),
    )
    needed = router.provider_for(platform).answer_seconds
    least = max(needed, router.answer_seconds) / (usable_seconds(1.0))
    with pytest.raises(LeaseTooShort, match="lease_seconds"):
        check_lease(harness.queue, least * 0.99, router)
    check_lease(harness.queue, least * 1.01, router)
    await router.aclose()

    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return PlatformRouter(
            apns=ApnsProvider(fake_apns.settings(timeout_seconds=timeout)),
            fcm=FcmProvider(fake_fcm.settings(timeout_seconds=timeout)),
        )

    app.push_handler(harness.queue, provider=provider, lease_seconds=least * 1.01)
    targets = [Target(platform=platform, token=f"edge-{n:03d}-xxxx") for n in range(50)]
    async with harness.run(app):
        await harness.publish(push_job_body(targets=targets, body="x"), message_id="edge-1")
        await wait_for(lambda: _settled(harness.db, len(targets)), timeout=30)
    assert harness.outcomes()["push_deferred"] == 0


async def test_a_worker_whose_lease_could_never_send_exits_78_naming_the_setting(
    db: DbConnection,
    worker_env: dict[str, str],
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    tmp_path: Path,
) -> None:
    env = {
        **worker_env,
        **fakes_env(fake_apns, fake_fcm, tmp_path, "TEST_"),
        "TEST_PROVIDER_TIMEOUT": "5",
        "TEST_LEASE_SECONDS": "6",  # 70% of it is 4.2 s: less than the 5 s timeout
    }
    worker = WorkerProcess("tests.apps.push_app:app", env, tmp_path / "misconfigured.log")
    try:
        await worker.expect_exit(78)
    finally:
        worker.stop_now()
    refused = worker.events("start_failed")
    assert len(refused) == 1 and refused[0]["error"] == "lease_too_short", refused
    assert "set lease_seconds to at least" in refused[0]["detail"]
