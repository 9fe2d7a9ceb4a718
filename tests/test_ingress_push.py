"""The send API with a push worker behind it: cancel races the worker, one push per device."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import httpx
import pytest

from consumers import Relay, Settings, bulk_lane, push_job_body
from dedupe import Messages
from ingress.settings import IngressSettings
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from providers.fakes.fcm import FakeFcm
from tests.conftest import DATABASE_URL
from tests.harness import Harness
from tests.ingress_support import Served, serve_in_process
from tests.support import wait_for
from tests.test_push import push_app

IOS = Target(platform=Platform.IOS, token="ios-token-aaaaaaaaaaaa")
ANDROID = Target(platform=Platform.ANDROID, token="android-token-cccccccc")
JOB = push_job_body(targets=[IOS, ANDROID], title="Shipped", data={"order": "1042"})


@pytest.fixture
async def served(harness: Harness, settings: Settings) -> AsyncIterator[Served]:
    async with serve_in_process(
        harness.db, settings.database, IngressSettings(queue=harness.queue)
    ) as s:
        yield s


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
    ) as client:
        yield client


@asynccontextmanager
async def relaying(harness: Harness) -> AsyncIterator[Relay]:
    """The outbox relay publishing the accepted jobs, as `idempotent-workers relay` does."""
    relay = Relay(harness.settings)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()


async def test_cancelled_job_sends_nothing(
    harness: Harness, http: httpx.AsyncClient, fake_apns: FakeApns, fake_fcm: FakeFcm
) -> None:
    message = (await http.post("/v1/messages", json={**JOB, "idempotency_key": "k"})).json()["id"]
    assert (await http.post(f"/v1/messages/{message}/cancel")).status_code == 200
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)), relaying(harness):
        await harness.wait_outcome("message_cancelled", 1)
    assert fake_apns.requests == [] and fake_fcm.requests == []
    view = (await http.get(f"/v1/messages/{message}")).json()
    assert view["status"] == "cancelled"
    assert [t["status"] for t in view["targets"]] == ["pending", "pending"]


async def test_taken_job_is_not_cancellable_and_is_sent_once_per_device(
    harness: Harness, http: httpx.AsyncClient, fake_apns: FakeApns, fake_fcm: FakeFcm
) -> None:
    body = {**JOB, "idempotency_key": "k-20"}
    answers = await asyncio.gather(*(http.post("/v1/messages", json=body) for _ in range(20)))
    message = answers[0].json()["id"]
    assert {a.json()["id"] for a in answers} == {message}
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)), relaying(harness):

        async def sent() -> bool:
            view = (await http.get(f"/v1/messages/{message}")).json()
            return [t["status"] for t in view["targets"]] == ["sent", "sent"]

        await wait_for(sent)
        refused = await http.post(f"/v1/messages/{message}/cancel")
    assert refused.status_code == 409
    assert refused.json() == {"error": "message_not_cancellable", "status": "taken"}
    assert len(fake_apns.requests_for(IOS.token)) == 1
    assert len(fake_fcm.requests_for(ANDROID.token)) == 1
    view = (await http.get(f"/v1/messages/{message}")).json()
    assert all(t["provider_message_id"] for t in view["targets"])


async def test_cancel_and_the_workers_take_race_and_exactly_one_wins(
    harness: Harness, http: httpx.AsyncClient, settings: Settings
) -> None:
    ids = []
    for n in range(40):
        answer = await http.post("/v1/messages", json={**JOB, "idempotency_key": f"race-{n}"})
        ids.append(answer.json()["id"])
    messages = Messages(settings.database.schema)
    pool = await asyncpg.create_pool(DATABASE_URL, min_size=4, max_size=4)

    async def take(message: str) -> bool:
        """The worker's claim transaction for one job; True when the cancel won."""
        async with pool.acquire() as conn, conn.transaction():
            return uuid.UUID(message) in await messages.take(conn, [uuid.UUID(message)])

    async def cancel(message: str) -> int:
        return (await http.post(f"/v1/messages/{message}/cancel")).status_code

    try:
        # Each job's take and cancel start together: which one wins varies, never both.
        results = await asyncio.gather(*(asyncio.gather(take(i), cancel(i)) for i in ids))
    finally:
        await pool.close()
    rows = {
        str(r["id"]): r["status"]
        for r in await harness.db.fetch("SELECT id, status FROM ingress_messages")
    }
    for message, (cancel_won_at_take, status) in zip(ids, results, strict=True):
        if cancel_won_at_take:
            assert (status, rows[message]) == (200, "cancelled")  # the worker sends nothing
        else:
            assert (status, rows[message]) == (409, "taken")  # the cancel came too late


async def test_one_send_to_more_devices_than_a_job_holds_reaches_each_once_and_is_counted(
    harness: Harness, http: httpx.AsyncClient, fake_apns: FakeApns, fake_fcm: FakeFcm
) -> None:
    # 950 devices: over the 500 of one job, so five parts of at most 200 (and under the
    # 1,000 a view lists one by one).
    devices = [{"platform": "android", "token": f"many-{n:05d}"} for n in range(950)]
    body = {**JOB, "targets": devices, "idempotency_key": "k-many"}
    first, again = [await http.post("/v1/messages", json=body) for _ in range(2)]
    assert first.status_code == 202 and again.json()["status"] == "duplicate_ignored"
    message = first.json()["id"]
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm)), relaying(harness):

        async def counted() -> bool:
            view = (await http.get(f"/v1/messages/{message}")).json()
            return bool(view["devices"] == {"sent": 950, "failed": 0, "pending": 0})

        await wait_for(counted, timeout=60)
    posts = [r.token for r in fake_fcm.requests]
    assert sorted(posts) == sorted(d["token"] for d in devices)  # each exactly once
    view = (await http.get(f"/v1/messages/{message}")).json()
    assert [t["index"] for t in view["targets"]] == list(range(950))
    assert {t["status"] for t in view["targets"]} == {"sent"}
    jobs = await harness.db.fetch("SELECT queue FROM outbox")
    assert [r["queue"] for r in jobs] == [bulk_lane(harness.queue)] * 5  # the parts' lane
