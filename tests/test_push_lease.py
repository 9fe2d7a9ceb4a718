"""Issue 9, case 1: no device is sent twice without a fault, however long sends queue.

The scenario of the issue, scaled to the test budget: the provider answers
slowly, one job fans out to more devices than the provider can have in flight,
so sends queue (FCM's connection slots, APNs' stream limit) for longer than the
ledger lease; a duplicate delivery of the job reaches a second worker after
the lease. No send may start after its lease can have expired: the second
worker must find every target either answered or back in `claimed`, never
`sending` under a lapsed lease while the first worker is still sending it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import pytest

from consumers import App, Publisher, RetryPolicy, Settings, Worker, push_job_body
from dedupe import DbConnection
from providers import (
    ApnsProvider,
    FcmProvider,
    Platform,
    PlatformRouter,
    Provider,
    ProviderReceipt,
    Push,
    RecordingProvider,
    SendIds,
    Target,
)
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.fcm import FakeFcm, FcmReply
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness
from tests.support import settle, wait_for

DEVICES = 40
LATENCY = 0.5  # the provider's answer time
IN_FLIGHT = 4  # FCM connections; APNs streams on its one connection
TIMEOUT = 1.0
LEASE = 3.0  # 40 devices / 4 in flight * 0.5 s = 5 s of sending: longer than the lease


def lease_app(queue: str, apns: FakeApns, fcm: FakeFcm) -> App:
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return PlatformRouter(
            apns=ApnsProvider(apns.settings(timeout_seconds=TIMEOUT, max_connections=1)),
            fcm=FcmProvider(
                fcm.settings(
                    timeout_seconds=TIMEOUT, connect_timeout_seconds=0.5, max_connections=IN_FLIGHT
                )
            ),
        )

    app.push_handler(queue, provider=provider, lease_seconds=LEASE)
    return app


@pytest.mark.parametrize("platform", [Platform.ANDROID, Platform.IOS])
async def test_slow_fanout_with_a_duplicate_after_the_lease_sends_no_device_twice(
    platform: Platform,
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
) -> None:
    async with (
        FakeApns(max_concurrent_streams=IN_FLIGHT, unscripted=ApnsReply(latency=LATENCY)) as apns,
        FakeFcm() as fcm,
    ):
        fcm.unscripted = FcmReply(latency=LATENCY)
        requests = apns.requests if platform is Platform.IOS else fcm.requests
        targets = [Target(platform=platform, token=f"device-{n:04d}-xxxx") for n in range(DEVICES)]
        body = push_job_body(targets=targets, title="Sale", body="Today only")
        app = lease_app(queue_name, apns, fcm)
        # The first worker holds one delivery at a time: the duplicate goes to the second.
        holding_one = replace(settings, worker=replace(settings.worker, push_prefetch=1))
        async with Worker(app, holding_one), Worker(app, settings):
            await publisher.publish(queue_name, body, message_id="fanout-1")
            await wait_for(lambda: _some(requests))
            await asyncio.sleep(LEASE + 0.5)  # the scenario: the copy arrives after the lease
            await publisher.publish(queue_name, body, message_id="fanout-1")
            await wait_for(lambda: _all_sent(db, DEVICES), timeout=60)
            await settle(lambda: _count(requests), quiet=1.5)
        sent = Counter(r.token for r in requests)
        assert set(sent) == {t.token for t in targets}
        twice = sorted(token for token, n in sent.items() if n > 1)
        assert twice == [], f"{len(twice)} of {DEVICES} devices sent twice"


async def _some(requests: Sequence[object]) -> bool:
    return bool(requests)


async def _count(requests: Sequence[object]) -> int:
    return len(requests)


async def _all_sent(db: DbConnection, n: int) -> bool:
    sent = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
    return bool(sent >= n)


class _SlowProvider(RecordingProvider):
    async def send(
        self, push: Push, ids: SendIds, *, deadline: float | None = None
    ) -> ProviderReceipt:
        await asyncio.sleep(SLOW_SEND)
        return await super().send(push, ids, deadline=deadline)


SLOW_SEND = 1.0
FAR_TIER = 30.0


@pytest.fixture
def retry_policy() -> RetryPolicy:
    """A short tier, and one far above the lease (the queue_name fixture deletes both)."""
    return RetryPolicy(max_attempts=5, base_seconds=0.5, tiers_seconds=(0.5, FAR_TIER))


async def test_a_duplicate_meeting_a_live_lease_comes_back_near_its_end_not_a_tier_later(
    harness: Harness, retry_policy: RetryPolicy
) -> None:
    # The job's copy meets the first one's live lease (LEASE s): it waits in a delay
    # tier. Rounded up to the next tier, a 30 s tier held it 30 s after a 1 s send:
    # after a SIGKILL mid-send, pushes of the demo waited 120 s for a 30 s lease.
    provider = _SlowProvider()
    app = App(retry=retry_policy)

    async def make() -> Provider:
        return provider

    app.push_handler(harness.queue, provider=make, lease_seconds=LEASE)
    body = push_job_body(targets=[Target(platform=Platform.IOS, token="ios-lease-xxxx")], body="x")
    async with harness.run(app):
        await harness.publish(body, message_id="order-7-shipped")
        await harness.publish(body, message_id="order-7-shipped")  # arrives during the send
        await harness.wait_outcome("duplicate_ignored", timeout=FAR_TIER / 3)
    waited = [e for e in harness.logs if e["event"] == "retry_scheduled"]
    assert [e["reason"] for e in waited] == ["send_in_progress"] * len(waited) and waited
    assert len(provider.sends) == 1
