"""Issue 22: a push worker holds the devices of its limit, never the whole send.

One `publish_push_job` of DEVICES devices goes out as parts of 200; the
worker's `push_held_devices` (IW_PUSH_HELD_DEVICES) bounds the devices of the
jobs it has taken and not settled. Seen from the ledger: a job's rows are
written when it is claimed and answered as its sends come back, so every row
still `claimed` or `sending` belongs to a job the worker holds, and their
number never passes the limit (or one part, when a part alone is larger).
The others wait unacked at the broker's side of the worker, spending nothing:
every device still gets one push, no deferral, no attempt spent.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import replace

import pytest

from consumers import App, Settings, publish_push_job, push_job_body
from providers import FcmProvider, Platform, Provider, Target
from providers.fakes.fcm import FakeFcm, FcmReply
from proving.deadlines import ANSWER_S
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness

DEVICES = 2_000  # 10 parts of 200
LATENCY = 0.05
SECONDS = 90.0  # one part at a time, 32 FCM threads at LATENCY: about 10 s; "stalled" past this

pytestmark = pytest.mark.timeout(int(SECONDS) + 60)


@pytest.mark.parametrize(
    ("limit", "most"),
    [(400, 400), (150, 200)],  # the second: a part larger than the limit goes alone
    ids=["two-parts", "one-part-alone"],
)
async def test_a_push_worker_holds_at_most_its_limit_of_a_large_sends_devices(
    harness: Harness, limit: int, most: int
) -> None:
    targets = [Target(platform=Platform.ANDROID, token=f"held-{n:05d}") for n in range(DEVICES)]
    async with FakeFcm() as fcm:
        fcm.unscripted = FcmReply(latency=LATENCY)
        app = App(retry=FAST_RETRY)

        async def provider() -> Provider:
            return FcmProvider(fcm.settings())

        app.push_handler(harness.queue, provider=provider)
        settings = replace(
            harness.settings, worker=replace(harness.settings.worker, push_held_devices=limit)
        )
        async with harness.run(app, settings):
            body = push_job_body(targets=targets[:1], title="Sale", body="Today only")
            body["targets"] = [{"platform": "android", "token": t.token} for t in targets]
            parts = await publish_push_job(
                harness.publisher, harness.queue, body, message_id="held-1"
            )
            peak = await _peak_unanswered(harness)
            await harness.wait_outcome("effect_committed", parts)
        posts = Counter(r.token for r in fcm.requests)
    print(f"push_memory: limit={limit} devices={DEVICES} peak_unanswered_rows={peak}")
    assert peak <= most, f"{peak} devices claimed and unanswered at once, limit {limit}"
    assert set(posts) == {t.token for t in targets}
    assert [token for token, n in posts.items() if n > 1] == []
    outcomes = harness.outcomes()
    assert (outcomes["dead_lettered"], outcomes["push_deferred"]) == (0, 0)
    assert outcomes["retry_scheduled"] == 0


async def _peak_unanswered(harness: Harness) -> int:
    """Read the ledger until every device is `sent`; the most rows unanswered at one reading."""
    peak = 0
    deadline = time.monotonic() + SECONDS
    while True:
        row = await harness.db.fetchrow(
            "SELECT count(*) FILTER (WHERE status IN ('claimed', 'sending')) AS unanswered,"
            " count(*) FILTER (WHERE status = 'sent') AS sent FROM send_ledger",
            timeout=ANSWER_S,
        )
        assert row is not None
        peak = max(peak, int(row["unanswered"]))
        if row["sent"] >= DEVICES:
            return peak
        if time.monotonic() > deadline:
            raise AssertionError(f"{row['sent']} of {DEVICES} devices sent within {SECONDS} s")
        await asyncio.sleep(0.02)


def test_the_device_limit_is_read_from_the_environment_and_refuses_zero() -> None:
    assert Settings.from_env({}).worker.push_held_devices == 10_000
    assert Settings.from_env({"IW_PUSH_HELD_DEVICES": "400"}).worker.push_held_devices == 400
    with pytest.raises(ValueError, match="push_held_devices"):
        Settings.from_env({"IW_PUSH_HELD_DEVICES": "0"})
