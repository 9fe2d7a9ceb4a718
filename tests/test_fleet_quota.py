"""Issue 56: a provider's quota is kept by the whole fleet, and one 429 pauses every worker.

Three worker processes send one send's devices to a fake FCM that refuses
(429, Retry-After) whatever comes past its quota. The workers keep the same
quota through PostgreSQL (IW_PROVIDER_QUOTAS): the fake never sees more than
`burst + per_second * (T + STASH_SECONDS + ARRIVAL)` requests in any T seconds
(a token is used within STASH_SECONDS of its take, and its request reaches
the fake within ARRIVAL of its use on a busy machine), so it refuses none. One device is
scripted to be answered 429 with a Retry-After of PAUSE seconds: from
PROPAGATION after that answer until the pause ends, no worker sends anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from consumers import ProviderQuota, Publisher, Settings, publish_push_job, push_job_body
from consumers.effects.quota import STASH_SECONDS, Bucket
from consumers.telemetry.metrics import Metrics
from dedupe import QUOTA_CHANNEL, DbConnection, ProviderQuotas, paused_notice
from providers import Platform, Target
from providers.fakes import FakeRateLimit
from providers.fakes.apns import FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm, FcmReply
from proving.deadlines import ANSWER_S, within
from tests.conftest import Spawn
from tests.support import wait_consumers, wait_for

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
PER_SECOND = 100.0
BURST = 20.0
ARRIVAL = 0.1  # seconds: a send starts with its token and reaches the fake a moment later
DEVICES = 1_200  # 6 parts of 200: two for each worker
PAUSE = 2  # the scripted 429's Retry-After, seconds
PROPAGATION = 0.25  # from a 429's answer to every worker having stopped
PAUSED_TOKEN = "device-000700-paused"

pytestmark = pytest.mark.timeout(180)


def most_in_a_window(times: list[float]) -> tuple[int, float, float]:
    """The largest excess of requests over `burst + rate * (T + STASH + ARRIVAL)` in any
    window: (excess, window start, window length)."""
    times = sorted(times)
    worst = (-(10**9), 0.0, 0.0)
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            span = times[j] - start
            allowed = BURST + PER_SECOND * (span + STASH_SECONDS + ARRIVAL)
            excess = (j - i + 1) - allowed
            if excess > worst[0]:
                worst = (int(excess), start, span)
    return worst


async def test_three_workers_keep_one_quota_and_a_retry_after_pauses_them_all(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    fake_apns: FakeApns,
    tmp_path: Path,
) -> None:
    async with FakeFcm() as fcm:
        fcm.unscripted = FcmReply(latency=0.01)
        allowed_at_once = BURST + PER_SECOND * (STASH_SECONDS + ARRIVAL)
        fcm.rate_limit = FakeRateLimit(per_second=PER_SECOND, burst=allowed_at_once)
        fcm.script(PAUSED_TOKEN, status=429, retry_after=PAUSE, times=1)
        env = {
            **fakes_env(fake_apns, fcm, tmp_path, "TEST_"),
            "IW_PROVIDER_QUOTAS": json.dumps({"fcm": {"per_second": PER_SECOND, "burst": BURST}}),
        }
        workers = [spawn(env, target="tests.apps.push_app:app") for _ in range(3)]
        await wait_consumers(AMQP_URL, f"{queue_name}.bulk", 3, timeout=60)
        tokens = [f"device-{n:06d}-{'paused' if n == 700 else 'x'}" for n in range(DEVICES)]
        body = push_job_body(targets=[Target(platform=Platform.ANDROID, token=tokens[0])])
        body["targets"] = [{"platform": "android", "token": t} for t in tokens]
        started = time.monotonic()
        await within(
            ANSWER_S,
            "the send confirmed",
            publish_push_job(publisher, queue_name, body, message_id="q-1"),
        )

        async def all_sent() -> bool:
            sent = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
            return bool(sent >= DEVICES)

        await wait_for(all_sent, timeout=DEVICES / PER_SECOND * 3 + 60, interval=0.2)
        requests = list(fcm.requests)
        refused = fcm.rate_limit.refused
    times = [r.received_at for r in requests]
    excess, at, span = most_in_a_window(times)
    paused_at = min(r.received_at for r in requests if r.token == PAUSED_TOKEN) + 0.01
    during = [t for t in times if paused_at + PROPAGATION < t < paused_at + PAUSE]
    last = max(times) - started
    print(
        f"fleet_quota: requests={len(requests)} over {last:.1f} s ({len(requests) / last:.0f}/s)"
        f" quota={PER_SECOND:g}/s burst={BURST:g} most_over_allowance={excess}"
        f" (window at {at - started:.2f} s, {span:.2f} s) refused_by_fake={refused}"
        f" sent_during_pause={len(during)}"
    )
    posts = Counter(r.token for r in requests)
    assert set(posts) == set(tokens)
    assert [t for t, n in posts.items() if n > 1] == [PAUSED_TOKEN]  # its 429, then its send
    assert refused == 0, f"the fake refused {refused} requests past its quota"
    assert excess <= 0
    assert during == [], f"{len(during)} requests during the pause a 429 asked for"
    senders = [w for w in workers if w.events("push_sent")]
    assert len(senders) == 3, "every worker sent some of the send"
    assert sum(len(w.events("provider_quota_paused")) for w in workers) == 1


# --- the bucket's own rules, in one process -----------------------------------


def test_the_quotas_are_read_from_the_environment() -> None:
    assert Settings.from_env({}).quotas.limits == {}
    given = '{"fcm": 10000, "apns:com.example.app": {"per_second": 50, "burst": 5}}'
    read = Settings.from_env({"IW_PROVIDER_QUOTAS": given}).quotas.limits
    assert read == {
        "fcm": ProviderQuota(per_second=10_000.0),
        "apns:com.example.app": ProviderQuota(per_second=50.0, burst=5.0),
    }
    assert read["fcm"].bucket == 10_000.0  # one second's, by default
    for wrong in ('{"fcm": "fast"}', "[1]", "{", '{"fcm": {"rate": 1}}', '{"fcm": 0}'):
        with pytest.raises(ValueError, match=r"IW_PROVIDER_QUOTAS|per_second"):
            Settings.from_env({"IW_PROVIDER_QUOTAS": wrong})


async def test_a_take_grants_the_burst_then_the_rate_and_nothing_while_paused(
    db: DbConnection, schema: str
) -> None:
    table = ProviderQuotas(schema)
    await table.configure(db, "fcm:p", 50.0, 10.0)
    first = await table.take(db, "fcm:p", 100)
    assert first is not None and first.granted == 10  # the burst, no more
    started = time.monotonic()
    await asyncio.sleep(0.2)  # the bucket's own clock: about 10 tokens come back
    again = await table.take(db, "fcm:p", 100)
    took = time.monotonic() - started
    assert again is not None and 5 <= again.granted <= 50 * took + 1
    assert await table.take(db, "nowhere", 1) is None
    left = await table.pause(db, "fcm:p", 3.0)
    assert left is not None and 2.5 < left <= 3.0
    paused = await table.take(db, "fcm:p", 100)
    assert paused is not None and paused.granted == 0 and 2.0 < paused.paused_seconds <= 3.0
    # A shorter pause never shortens a longer one.
    shorter = await table.pause(db, "fcm:p", 1.0)
    assert shorter is not None and shorter > 2.0


async def test_a_pause_is_told_to_every_listener_of_the_schema(
    db: DbConnection, schema: str
) -> None:
    heard: list[tuple[str, float]] = []
    listener = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/postgres")
    try:

        def told(_c: object, _p: int, _ch: str, payload: object) -> None:
            notice = paused_notice(str(payload), schema)
            if notice is not None:
                heard.append(notice)

        await listener.add_listener(QUOTA_CHANNEL, told)
        table = ProviderQuotas(schema)
        await table.configure(db, "apns:com.example.app", 10.0, 1.0)
        await table.pause(db, "apns:com.example.app", 4.0)

        async def told_once() -> bool:
            return bool(heard)

        await wait_for(told_once, timeout=10)
    finally:
        await listener.close()
    assert heard[0][0] == "apns:com.example.app" and 3.5 < heard[0][1] <= 4.0
    assert paused_notice('{"schema": "elsewhere", "name": "x", "seconds": 1}', schema) is None


async def test_two_processes_buckets_stay_within_the_quota_and_use_their_tokens_at_once(
    db: DbConnection, schema: str, settings: Settings
) -> None:
    """Two `Bucket`s on one row (two workers' worth): sends over any window stay within
    `burst + rate * (T + STASH_SECONDS)`."""
    quota = ProviderQuota(per_second=200.0, burst=10.0)
    pool = await asyncpg.create_pool(settings.database.url, min_size=1, max_size=4)
    assert pool is not None
    try:
        buckets = [
            Bucket(
                name="fcm", quota=quota, pool=pool, table=ProviderQuotas(schema), metrics=Metrics()
            )
            for _ in range(2)
        ]
        await buckets[0].configure()
        sent: list[float] = []

        async def sender(bucket: Bucket) -> None:
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                assert await bucket.acquire() is None
                sent.append(time.monotonic())

        async with asyncio.timeout(30):
            await asyncio.gather(*(sender(b) for b in buckets for _ in range(20)))
    finally:
        await pool.close()
    sent.sort()
    worst = max(
        (j - i + 1) - (quota.bucket + quota.per_second * (sent[j] - sent[i] + STASH_SECONDS))
        for i in range(0, len(sent), 7)
        for j in range(i, len(sent), 3)
    )
    rate = len(sent) / (sent[-1] - sent[0])
    print(f"buckets: {len(sent)} sends at {rate:.0f}/s, most over the allowance {worst:.1f}")
    assert worst <= 1
    assert rate > quota.per_second * 0.6  # the tokens are used, not dropped
