"""Issue 56: a worker started while a send is under way takes a share of its parts.

A send's parts go to the queue's bulk lane, which a worker consumes with a
prefetch of about what it holds (`bulk_prefetch`): the other parts stay in
the broker, so a second worker started after the first began sending gets
its share of the parts not yet taken, and the send ends sooner. Each worker
sends to a fake of its own, so the fakes count who sent what; every device
gets one request. (The full-size figures: `python -m proving.bench.fanout
--workers 1 2 --join-after 5`.)
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import pytest

from consumers import App, Settings, publish_push_job, push_job_body
from providers import FcmProvider, Platform, Provider, Target
from providers.fakes.fcm import FakeFcm, FcmReply
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness
from tests.support import wait_for

DEVICES = 4_000  # 20 parts of 200
HELD = 400  # two parts at a time
LATENCY = 0.05

pytestmark = pytest.mark.timeout(180)


def fcm_app(queue: str, fcm: FakeFcm) -> App:
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return FcmProvider(fcm.settings())

    app.push_handler(queue, provider=provider)
    return app


async def test_a_worker_started_while_a_send_is_under_way_takes_a_share_of_its_parts(
    harness: Harness,
) -> None:
    settings: Settings = replace(
        harness.settings,
        worker=replace(harness.settings.worker, push_held_devices=HELD, push_bulk_prefetch=3),
    )
    tokens = [f"spread-{n:05d}-x" for n in range(DEVICES)]
    body = push_job_body(targets=[Target(platform=Platform.ANDROID, token=tokens[0])])
    body["targets"] = [{"platform": "android", "token": t} for t in tokens]
    async with FakeFcm() as first_fcm, FakeFcm() as second_fcm:
        for fcm in (first_fcm, second_fcm):
            fcm.unscripted = FcmReply(latency=LATENCY)
        async with harness.run(fcm_app(harness.queue, first_fcm), settings):
            started = time.monotonic()
            await publish_push_job(harness.publisher, harness.queue, body, message_id="s-1")

            async def under_way() -> bool:
                return len(first_fcm.requests) >= 2 * 200

            await wait_for(under_way, timeout=60)
            joined = len(first_fcm.requests)
            async with harness.run(fcm_app(harness.queue, second_fcm), settings):

                async def all_sent() -> bool:
                    sent = await harness.db.fetchval(
                        "SELECT count(*) FROM send_ledger WHERE status = 'sent'"
                    )
                    return bool(sent >= DEVICES)

                await wait_for(all_sent, timeout=120, interval=0.2)
        took = time.monotonic() - started
        first = Counter(r.token for r in first_fcm.requests)
        second = Counter(r.token for r in second_fcm.requests)
    print(
        f"push_spread: devices={DEVICES} second_joined_after={joined} sent_by_first="
        f"{sum(first.values())} sent_by_second={sum(second.values())} took_s={took:.1f}"
    )
    assert set(first) | set(second) == set(tokens)
    assert not set(first) & set(second) and max((first + second).values()) == 1
    # The second worker took parts the first had not: at least a third of what was left.
    assert sum(second.values()) >= (DEVICES - joined) / 3
