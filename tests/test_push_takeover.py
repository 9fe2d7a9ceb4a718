"""Issue 22: leases that follow the work, when the worker holding them fails.

- SIGKILLed in the middle of a large send, a worker's leases lapse and another
  worker finishes the send: no device gets a second request beyond the crash
  window (the requests on the wire at the kill, answered or not, whose answer
  was not recorded);
- a worker whose lease renewal fails (its database connection stalled by the
  chaos proxy) starts no send after its lease's end.

The suite runs a CI-sized send; the issue's size is a command:

    IW_CRASH_DEVICES=10000 .venv/bin/pytest tests/test_push_takeover.py -q -s -k sigkilled
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from consumers import App, Publisher, Settings, publish_push_job, push_job_body
from consumers.effects.lease import Lease
from dedupe import DbConnection, DedupeKey, SendLedger
from providers import FcmProvider, Platform, Provider, Target
from providers.fakes.apns import FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm, FcmReply
from proving.chaos.proxy import FaultProxy
from proving.deadlines import ANSWER_S, within
from tests.apps.push_app import FAST_RETRY
from tests.conftest import AMQP_URL, DATABASE_URL
from tests.harness import Harness
from tests.support import WorkerProcess, settle, wait_consumers, wait_for

DEVICES = int(os.environ.get("IW_CRASH_DEVICES", "2000"))
LEASE = 10.0  # tests.apps.push_app's default

pytestmark = pytest.mark.timeout(int(DEVICES / 32 * 0.05 * 4 + LEASE * 4 + 60))


def _send_body(targets: list[Target]) -> dict[str, object]:
    body = push_job_body(targets=targets[:1], body="x")
    body["targets"] = [{"platform": str(t.platform), "token": t.token} for t in targets]
    return body


async def _sent(db: DbConnection) -> set[str]:
    rows = await db.fetch("SELECT address FROM send_ledger WHERE status = 'sent'")
    return {r["address"] for r in rows}


async def test_a_send_whose_worker_is_sigkilled_is_finished_by_another_once_beyond_the_window(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    worker_env: dict[str, str],
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    tmp_path: Path,
) -> None:
    fake_fcm.unscripted = FcmReply(latency=0.02)
    env = {**worker_env, **fakes_env(fake_apns, fake_fcm, tmp_path, "TEST_")}
    env["TEST_LEASE_SECONDS"] = str(LEASE)
    first = WorkerProcess("tests.apps.push_app:app", env, tmp_path / "first.log")
    second: WorkerProcess | None = None
    try:
        await wait_consumers(AMQP_URL, queue_name, 1)
        targets = [Target(platform=Platform.ANDROID, token=f"kill-{n:06d}") for n in range(DEVICES)]
        await publish_push_job(publisher, queue_name, _send_body(targets), message_id="kill-1")

        async def half_requested() -> bool:
            return len(fake_fcm.requests) >= DEVICES // 2

        await wait_for(half_requested, timeout=DEVICES / 32 * 0.05 * 4 + 30)
        first.kill()
        await first.wait()
        # What reached the fake from the dead worker, its last bytes included.
        await settle(lambda: _count(fake_fcm), quiet=1.0)
        requested = {r.token for r in fake_fcm.requests}
        window = requested - await _sent(db)  # on the wire at the kill, answer not recorded
        killed_at = time.monotonic()

        second = WorkerProcess("tests.apps.push_app:app", env, tmp_path / "second.log")

        async def all_sent() -> bool:
            return len(await _sent(db)) >= DEVICES

        await wait_for(all_sent, timeout=LEASE * 3 + DEVICES / 32 * 0.05 * 4 + 30)
        finished = time.monotonic() - killed_at
    finally:
        first.stop_now()
        if second is not None:
            second.terminate()
            await second.expect_exit(0)
    posts = Counter(r.token for r in fake_fcm.requests)
    assert set(posts) == {t.token for t in targets}
    twice = {token for token, n in posts.items() if n > 1}
    assert twice <= window, f"{len(twice - window)} devices sent twice outside the crash window"
    assert max(posts.values()) <= 2
    print(
        f"takeover: devices={DEVICES} in_crash_window={len(window)} sent_twice={len(twice)}"
        f" finished_s_after_kill={finished:.1f}"
    )


async def _count(fake: FakeFcm) -> int:
    return len(fake.requests)


# --- a renewal that fails -----------------------------------------------------

HELD_LEASE = 3.0
LATENCY = 0.2
THREADS = 4
# Seven times the fake's answer time, so a loaded machine does not turn answers into
# timeouts (each sends the job to a retry tier, where it holds no lease for the hold
# to make fail), and under the most a 3 s lease allows (70% of it: 2.1 s, less FCM's
# 0.1 s of connect time), so sends still start between renewals.
ANSWER_TIMEOUT = 1.5


@pytest.fixture
async def pg_proxy() -> AsyncIterator[FaultProxy]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    upstream = urlsplit(DATABASE_URL)
    proxy = FaultProxy(
        "postgresql", port, upstream.port or 5432, upstream_host=upstream.hostname or "127.0.0.1"
    )
    await proxy.start()
    yield proxy
    await proxy.close()


def _through(url: str, proxy: FaultProxy) -> str:
    parts = urlsplit(url)
    auth = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{proxy.port}"))


async def test_a_worker_whose_lease_renewal_fails_starts_no_send_after_its_lease(
    harness: Harness, settings: Settings, pg_proxy: FaultProxy
) -> None:
    async with FakeFcm() as fcm:
        fcm.unscripted = FcmReply(latency=LATENCY)
        app = App(retry=FAST_RETRY)

        async def provider() -> Provider:
            return FcmProvider(
                fcm.settings(
                    timeout_seconds=ANSWER_TIMEOUT,
                    connect_timeout_seconds=0.5,
                    max_connections=THREADS,
                )
            )

        app.push_handler(harness.queue, provider=provider, lease_seconds=HELD_LEASE)
        # 200 devices, 4 at a time, 0.2 s each: 10 s of sending, three leases and more.
        targets = [Target(platform=Platform.ANDROID, token=f"held-{n:04d}") for n in range(200)]
        proxied = replace(
            settings, database=replace(settings.database, url=_through(DATABASE_URL, pg_proxy))
        )
        async with harness.run(app, proxied):
            await harness.publish(_send_body(targets), message_id="held-1")

            async def renewed_once() -> bool:  # sending past the first lease: it renews
                return len(fcm.requests) >= THREADS * (HELD_LEASE / LATENCY) * 1.2

            await wait_for(renewed_once, timeout=30)
            held_at = time.monotonic()  # no renewal can start after this and succeed
            # Four leases of silence: a renewal caught on the held connection, or
            # waiting behind a recording caught there, is lost at its lease's end,
            # while the connection is still held; not when the hold ends and the
            # connection is given back.
            hold = asyncio.create_task(pg_proxy.hold(HELD_LEASE * 4))

            async def renewal_lost() -> bool:
                return any(e["event"] == "send_lease_lost" for e in harness.logs)

            try:
                await wait_for(renewal_lost, timeout=HELD_LEASE * 3)
            except AssertionError:
                events = Counter(str(e["event"]) for e in harness.logs)
                raise AssertionError(
                    f"no loss said within 3 leases of a 4-lease hold ({hold.done()=}):"
                    f" a renewal waited on its stuck connection; events: {dict(events)}"
                ) from None
            finally:
                await hold
            late = [r for r in fcm.requests if r.received_at > held_at + HELD_LEASE]
    assert late == [], f"{len(late)} sends started after the lease could have expired"
    assert len({r.token for r in fcm.requests}) == len(fcm.requests)


async def test_a_renewal_on_a_connection_that_stopped_answering_is_lost_at_the_leases_end(
    db: DbConnection, schema: str, pg_proxy: FaultProxy
) -> None:
    """The renewal's statement is cancelled at the lease's end, but asyncpg gives its
    connection back to the pool only once the reset gets through: the loss is said
    at the lease's end all the same, not when the connection answers again."""
    lease_seconds = 1.0
    pool = await asyncpg.create_pool(
        _through(DATABASE_URL, pg_proxy), min_size=1, max_size=1, timeout=ANSWER_S
    )
    try:
        lease = Lease(
            SendLedger(schema, owner="stuck"),
            expires_at=datetime.now(UTC),
            ends=time.monotonic() + lease_seconds,
            lease_seconds=lease_seconds,
        )
        key = DedupeKey(consumer="q", tenant="", message_id="stuck-1")
        hold = asyncio.create_task(pg_proxy.hold(lease_seconds * 5))

        async def silent() -> bool:
            return pg_proxy.holding

        await wait_for(silent, timeout=ANSWER_S)
        began = time.monotonic()
        renewal = lease.extend(pool, asyncio.Lock(), lambda: {key: 1})
        await within(lease_seconds * 4, "the renewal's end", renewal)
        waited = time.monotonic() - began
        assert lease.lost and not hold.done(), "the loss waited for the connection to answer"
        assert waited <= lease_seconds * 2, f"lost {waited:.2f} s into a {lease_seconds} s lease"
        await hold
    finally:
        await within(ANSWER_S * 2, "the pool's close", pool.close())
