"""Issue 22: one send to many devices, every setting at its default: each device once.

One `publish_push_job` (one message_id) fans out to DEVICES devices, the
provider answering after 100 ms. No job may be dead-lettered, no attempt spent
on a deferral, and every device gets exactly one request. The suite runs a
CI-sized send; the issue's size is a command:

    IW_FANOUT_DEVICES=20000 .venv/bin/pytest tests/test_push_fanout.py -q -s

which prints each run's `fanout:` line (devices, seconds to the last device).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from consumers import App, publish_push_job, push_job_body
from providers import ApnsProvider, FcmProvider, Platform, Provider, Target
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.fcm import FakeFcm, FcmReply
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness
from tests.support import wait_for

DEVICES = int(os.environ.get("IW_FANOUT_DEVICES", "2000"))
LATENCY = 0.1
# FCM's 32 threads, or APNs' 2 connections of 10 streams, at LATENCY per request,
# plus the same again for claims, records and acks: a deadline that says "stalled".
FCM_SECONDS = DEVICES / 32 * LATENCY * 2 + 30
APNS_SECONDS = DEVICES / 20 * LATENCY * 2 + 30

pytestmark = pytest.mark.timeout(int(max(FCM_SECONDS, APNS_SECONDS)) + 60)


def devices(platform: Platform) -> list[Target]:
    return [Target(platform=platform, token=f"fan-{n:06d}-{platform}") for n in range(DEVICES)]


async def test_a_send_to_many_android_devices_reaches_each_once_with_the_defaults(
    harness: Harness,
) -> None:
    async with FakeFcm() as fcm:
        fcm.unscripted = FcmReply(latency=LATENCY)
        app = App(retry=FAST_RETRY)

        async def provider() -> Provider:
            return FcmProvider(fcm.settings())  # every limit at its default

        app.push_handler(harness.queue, provider=provider)
        targets = devices(Platform.ANDROID)
        async with harness.run(app):
            took = await _send(harness, targets, "blast-android", FCM_SECONDS)
        posts = Counter(r.token for r in fcm.requests)
        last = max(r.received_at for r in fcm.requests)
    _check(harness, targets, posts)
    print(f"fanout: fcm devices={DEVICES} latency_s={LATENCY} last_device_s={last - took:.1f}")


async def test_a_send_to_many_ios_devices_reaches_each_once_with_ten_streams_on_two_connections(
    harness: Harness,
) -> None:
    unscripted = ApnsReply(latency=LATENCY)
    async with FakeApns(max_concurrent_streams=10, unscripted=unscripted) as apns:
        app = App(retry=FAST_RETRY)

        async def provider() -> Provider:
            return ApnsProvider(apns.settings(max_connections=2))

        app.push_handler(harness.queue, provider=provider)
        targets = devices(Platform.IOS)
        async with harness.run(app):
            took = await _send(harness, targets, "blast-ios", APNS_SECONDS)
        posts = Counter(r.token for r in apns.requests)
        last = max(r.received_at for r in apns.requests)
    _check(harness, targets, posts)
    print(f"fanout: apns devices={DEVICES} latency_s={LATENCY} last_device_s={last - took:.1f}")


async def _send(harness: Harness, targets: list[Target], message_id: str, seconds: float) -> float:
    """Publish the send once; wait until every device's row is `sent`; return the start."""
    started = time.monotonic()
    body = push_job_body(targets=targets[:1], title="Sale", body="Today only")
    body["targets"] = [  # more than one job holds: publish_push_job splits it
        {"platform": str(t.platform), "token": t.token} for t in targets
    ]

    parts = await publish_push_job(harness.publisher, harness.queue, body, message_id=message_id)
    assert parts == -(-DEVICES // 200)

    async def all_sent() -> bool:
        sent = await harness.db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
        return bool(sent >= len(targets))

    await wait_for(all_sent, timeout=seconds, interval=0.5)

    # The last part's ack follows its last record: wait for every part's outcome line.
    async def all_settled() -> bool:
        return harness.outcomes()["effect_committed"] >= parts

    await wait_for(all_settled, timeout=30)
    return started


def _check(harness: Harness, targets: list[Target], posts: Counter[str]) -> None:
    assert set(posts) == {t.token for t in targets}
    twice = [token for token, n in posts.items() if n > 1]
    assert twice == [], f"{len(twice)} of {len(targets)} devices got two requests"
    outcomes = harness.outcomes()
    assert outcomes["dead_lettered"] == 0
    assert outcomes["push_deferred"] == 0
    spent = [e for e in harness.logs if e["event"] == "retry_scheduled"]
    assert spent == [], spent[:3]
