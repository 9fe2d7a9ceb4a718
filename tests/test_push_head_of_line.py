"""Issue 9, case 2: a silent device delays only its own job, never the queue behind it."""

from __future__ import annotations

import statistics
import time

from consumers import Publisher, Settings, Worker, push_job_body
from dedupe import DbConnection
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from tests.providers.pushes import apns_push_app, requested, sent
from tests.support import wait_for

FAST_JOBS = 200
TIMEOUT = 10.0  # the silent device's send ends only at the provider's timeout
# A fast job held behind the silent one would wait for that timeout; one that is not
# is recorded as fast as the machine goes, so half the timeout tells the two apart
# on a loaded machine as on a quiet one.
P99_LIMIT = TIMEOUT / 2


async def test_200_fast_jobs_behind_a_silent_device_are_recorded_before_its_timeout(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    fake_apns: FakeApns,
) -> None:
    fake_apns.script("silent-device-xxxx", latency=60.0)  # never answers in time
    app = apns_push_app(queue_name, fake_apns, timeout=TIMEOUT)
    published: dict[str, float] = {}
    async with Worker(app, settings):
        silent = Target(platform=Platform.IOS, token="silent-device-xxxx")
        await publisher.publish(
            queue_name, push_job_body(targets=[silent], body="x"), message_id="silent"
        )
        await wait_for(lambda: requested(fake_apns, 1))
        for n in range(FAST_JOBS):
            device = Target(platform=Platform.IOS, token=f"fast-device-{n:04d}")
            published[f"fast-{n}"] = time.time()
            body = push_job_body(targets=[device], body="x")
            await publisher.publish(queue_name, body, message_id=f"fast-{n}")
        await wait_for(lambda: sent(db, FAST_JOBS), timeout=60)
        rows = await db.fetch(
            "SELECT message_id, extract(epoch FROM updated_at)::float8 AS at"
            " FROM send_ledger WHERE status = 'sent'"
        )
    delays = sorted(r["at"] - published[r["message_id"]] for r in rows)
    p99 = delays[int(len(delays) * 0.99) - 1]
    print(
        f"fast jobs recorded after publish: p50 {statistics.median(delays):.3f} s, p99 {p99:.3f} s"
    )
    assert p99 <= P99_LIMIT, f"p99 {p99:.2f} s behind a silent device"
