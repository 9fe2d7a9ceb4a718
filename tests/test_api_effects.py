"""Calls to an API that takes an idempotency key, through the send ledger: httpx against
the fake payments API, which keeps keys as Stripe documents and counts charges by key.

A call whose outcome is unknown is made again with the same key while the provider
still replays it, or the provider is asked first; past the window it is never made.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from consumers import REASON_HEADER, App, Publisher, api_job_body
from dedupe import DbConnection
from providers import ApiSettings
from providers.fakes.payments import FakePayments
from tests.apps.api_app import FAST_RETRY
from tests.apps.payments import LookedUpPaymentsApi, PaymentsApi
from tests.conftest import AMQP_URL
from tests.harness import Harness
from tests.support import WorkerProcess, wait_consumers, wait_for


def api_app(
    queue: str, fake: FakePayments, api: type[PaymentsApi] = PaymentsApi, *, timeout: float = 5.0
) -> App:
    app = App(retry=FAST_RETRY)
    settings = ApiSettings(
        base_url=fake.base_url, timeout_seconds=timeout, connect_timeout_seconds=1
    )
    app.api_handler(queue, api=api, settings=settings, lease_seconds=max(3.0, timeout * 2))
    return app


def charge(customer: str, amount: int = 2000) -> dict[str, object]:
    return api_job_body(PaymentsApi, {"amount": amount, "currency": "usd", "customer": customer})


async def ledger(db: DbConnection) -> list[tuple[str, str, str, int]]:
    rows = await db.fetch(
        "SELECT channel, address, status, sends FROM send_ledger ORDER BY message_id"
    )
    return [(r["channel"], r["address"], r["status"], r["sends"]) for r in rows]


async def all_settled(db: DbConnection, n: int) -> bool:
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')")
    return bool(done >= n)


async def keys(db: DbConnection) -> dict[str, str]:
    """Each row's idempotency key (its effect_id), by address."""
    rows = await db.fetch("SELECT address, effect_id::text FROM send_ledger")
    return {r["address"]: r["effect_id"] for r in rows}


async def test_each_job_is_one_call_and_a_redelivery_calls_nothing(
    harness: Harness, fake_payments: FakePayments
) -> None:
    customers = ["cus_1", "cus_2", "cus_3"]
    async with harness.run(api_app(harness.queue, fake_payments)):
        for customer in customers:
            await harness.publish(charge(customer), message_id=f"pay-{customer}", tenant="acme")
            await harness.publish(charge(customer), message_id=f"pay-{customer}", tenant="acme")
        await wait_for(lambda: all_settled(harness.db, 3))
        await harness.publish(charge("cus_1"), message_id="pay-cus_1", tenant="acme")
        await harness.wait_outcome("duplicate_ignored", 4)
    assert await ledger(harness.db) == [("payments", c, "sent", 1) for c in customers]
    by_address = await keys(harness.db)
    assert dict(fake_payments.created_by_key) == {by_address[c]: 1 for c in customers}
    assert len(fake_payments.requests) == 3
    assert {r.params["metadata[tenant]"] for r in fake_payments.requests} == {"acme"}
    ids = {r["provider_message_id"] for r in await harness.db.fetch("SELECT * FROM send_ledger")}
    assert ids == set(fake_payments.charges)
    assert harness.outcomes()["payments_sent"] == 3


async def test_a_503_is_retried_with_the_same_key_and_charges_once(
    harness: Harness, fake_payments: FakePayments
) -> None:
    fake_payments.script("cus_1", status=503, retry_after=0.3, times=1)
    async with harness.run(api_app(harness.queue, fake_payments)):
        await harness.publish(charge("cus_1"), message_id="pay-1")
        await wait_for(lambda: all_settled(harness.db, 1), timeout=20)
    assert await ledger(harness.db) == [("payments", "cus_1", "sent", 2)]
    (key,) = (await keys(harness.db)).values()
    assert [r.status for r in fake_payments.posts_with_key(key)] == [503, 200]
    assert fake_payments.created_by_key == {key: 1}


async def test_a_call_the_provider_refuses_for_good_fails_its_row_once(
    harness: Harness, fake_payments: FakePayments
) -> None:
    fake_payments.script("cus_1", status=402)  # a card declined: kept, and not retried
    async with harness.run(api_app(harness.queue, fake_payments)):
        await harness.publish(charge("cus_1"), message_id="pay-1")
        await wait_for(lambda: all_settled(harness.db, 1), timeout=20)
    assert await ledger(harness.db) == [("payments", "cus_1", "failed", 1)]
    assert len(fake_payments.requests) == 1
    assert await harness.dead_letters() == []


async def test_a_job_its_api_refuses_is_dead_lettered_with_the_apis_reason(
    harness: Harness, fake_payments: FakePayments
) -> None:
    async with harness.run(api_app(harness.queue, fake_payments)):
        await harness.publish({"amount": -5, "currency": "usd", "customer": "c"}, message_id="neg")
        await harness.publish({"amount": 5, "currency": "usd"}, message_id="nobody")
        await harness.wait_dead_letters(2)
    dead = {d.message_id: d for d in await harness.dead_letters()}
    assert dead["neg"].headers[REASON_HEADER] == "invalid_payments_job"
    assert "amount" in str(dead["neg"].headers["x-error"])
    assert "customer" in str(dead["nobody"].headers["x-error"])  # the address field
    assert fake_payments.requests == []
    with pytest.raises(ValueError, match="amount"):
        charge("cus_1", amount=0)  # the publisher side refuses the same


@pytest.mark.parametrize("api", [PaymentsApi, LookedUpPaymentsApi])
async def test_a_timed_out_call_is_replayed_or_looked_up_and_charges_once(
    harness: Harness, fake_payments: FakePayments, api: type[PaymentsApi]
) -> None:
    fake_payments.script("cus_1", silent=True, times=1)  # charged, never answered
    async with harness.run(api_app(harness.queue, fake_payments, api, timeout=1.0)):
        await harness.publish(charge("cus_1"), message_id="pay-1")
        await wait_for(lambda: all_settled(harness.db, 1), timeout=20)
    (key,) = (await keys(harness.db)).values()
    assert fake_payments.created_by_key == {key: 1}
    posts = fake_payments.posts_with_key(key)
    if api is LookedUpPaymentsApi:  # asked first: found, not called again
        assert (len(posts), len(fake_payments.lookups())) == (1, 1)
        assert harness.outcomes()["payments_lookup_sent"] == 1
        assert [e.get("found_by_lookup") for e in harness.logs if e["event"].endswith("_sent")] == [
            True
        ]
    else:  # called again with the key: the first answer replayed
        assert [p.replayed for p in posts] == [False, True]
    row = await harness.db.fetchrow("SELECT status, provider_message_id FROM send_ledger")
    assert row is not None and row["status"] == "sent"
    assert row["provider_message_id"] in fake_payments.charges


async def test_an_api_the_apps_own_build_makes_is_the_one_called(harness: Harness) -> None:
    async with FakePayments(api_key="sk_from_a_vault") as fake:

        async def build() -> PaymentsApi:  # e.g. a secret read when the worker starts
            auth = {"Authorization": "Bearer sk_from_a_vault"}
            return PaymentsApi(ApiSettings(base_url=fake.base_url, headers=auth))

        app = App(retry=FAST_RETRY)
        app.api_handler(harness.queue, api=PaymentsApi, build=build)
        async with harness.run(app):
            await harness.publish(charge("cus_1"), message_id="pay-1")
            await wait_for(lambda: all_settled(harness.db, 1))
        assert [r.status for r in fake.requests] == [200]


# --- real worker processes, SIGKILLed while the provider holds its answer -----

HELD = ["cus_0", "cus_1"]
CUSTOMERS = [*HELD, "cus_2", "cus_3", "cus_4"]
# The held answers must still be awaited at the kill (a 5 s timeout; the others are
# answered at once), under the least lease that covers a call: 70% of 9 s > 5 s + 1 s.
SHORT = {"TEST_LEASE_SECONDS": "9", "TEST_API_TIMEOUT": "5"}


SpawnApi = Callable[[str, dict[str, str]], WorkerProcess]


@pytest.fixture
def spawn_api(worker_env: dict[str, str], tmp_path: Path) -> Iterator[SpawnApi]:
    started: list[WorkerProcess] = []

    def start(base_url: str, extra: dict[str, str]) -> WorkerProcess:
        env = {**worker_env, "TEST_PAYMENTS_URL": base_url, **SHORT, **extra}
        worker = WorkerProcess("tests.apps.api_app:app", env, tmp_path / f"api-{len(started)}.log")
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop_now()


async def _kill_while_held(
    db: DbConnection,
    queue: str,
    publisher: Publisher,
    fake: FakePayments,
    start: SpawnApi,
    extra: dict[str, str],
) -> None:
    """Publish a charge per customer, the provider holding the answers to HELD (their
    charges made); SIGKILL the worker once the others are recorded; start another."""
    answer = asyncio.Event()
    for customer in HELD:
        fake.script(customer, until=answer, times=1)
    first = start(fake.base_url, extra)
    await wait_consumers(AMQP_URL, queue, 1)
    for customer in CUSTOMERS:
        await publisher.publish(queue, charge(customer), message_id=f"pay-{customer}")

    async def others_recorded() -> bool:
        sent = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
        return sent == len(CUSTOMERS) - len(HELD) and len(fake.requests) == len(CUSTOMERS)

    await wait_for(others_recorded, timeout=30)
    first.kill()
    assert await first.wait() == -signal.SIGKILL
    assert "_deferred" not in first.log_text()  # the held calls were still waiting
    answer.set()  # to a dead socket
    statuses = await db.fetch("SELECT address, status FROM send_ledger WHERE status = 'sending'")
    assert sorted(r["address"] for r in statuses) == HELD  # received, answer not recorded
    second = start(fake.base_url, extra)
    await wait_for(lambda: all_settled(db, len(CUSTOMERS)), timeout=40)
    second.terminate()
    await second.expect_exit(0)


@pytest.mark.parametrize("api", ["payments", "payments_lookup"])
async def test_worker_killed_while_the_provider_held_its_answer_charges_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn_api: SpawnApi,
    fake_payments: FakePayments,
    api: str,
) -> None:
    await _kill_while_held(db, queue_name, publisher, fake_payments, spawn_api, {"TEST_API": api})
    by_address = await keys(db)
    assert dict(fake_payments.created_by_key) == {by_address[c]: 1 for c in CUSTOMERS}
    posts = {c: fake_payments.posts_with_key(by_address[c]) for c in CUSTOMERS}
    if api == "payments":  # each held call made again with its key: the answer replayed
        assert {c: [p.replayed for p in posts[c]] for c in HELD} == {c: [False, True] for c in HELD}
        lookups = 0
    else:  # each held call asked about first: found, never made again
        assert {c: len(posts[c]) for c in HELD} == dict.fromkeys(HELD, 1)
        lookups = len(fake_payments.lookups())
        assert lookups == len(HELD)
    assert all(len(posts[c]) == 1 for c in CUSTOMERS if c not in HELD)
    rows = await db.fetch("SELECT address, status, sends, provider_message_id FROM send_ledger")
    assert {r["status"] for r in rows} == {"sent"}
    assert {r["provider_message_id"] for r in rows} == set(fake_payments.charges)
    print(
        f"api sigkill ({api}): calls={len(CUSTOMERS)} held_at_kill={len(HELD)}"
        f" posts={sum(map(len, posts.values()))} lookups={lookups}"
        f" charges_made={sum(fake_payments.created_by_key.values())}"
    )


async def test_a_call_whose_first_attempt_is_past_the_window_is_never_made_again(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn_api: SpawnApi,
) -> None:
    """The provider keeps a key for 9 s here, the channel's window the same: a second
    worker takes the held calls over after their 9 s lease, past the window, where a
    call would be a new charge (the fake would make one). It makes none: the rows fail
    as `unknown_outcome: replay_window_passed`, for an operator to reconcile."""
    window = SHORT["TEST_LEASE_SECONDS"]
    async with FakePayments(window_seconds=float(window)) as fake:
        await _kill_while_held(
            db, queue_name, publisher, fake, spawn_api, {"TEST_WINDOW_SECONDS": window}
        )
        by_address = await keys(db)
        assert {c: len(fake.posts_with_key(by_address[c])) for c in CUSTOMERS} == dict.fromkeys(
            CUSTOMERS, 1
        )
        assert sum(fake.created_by_key.values()) == len(CUSTOMERS)
    rows = await db.fetch(
        "SELECT address, status, failure_reason FROM send_ledger ORDER BY address"
    )
    assert [tuple(r) for r in rows if r["address"] in HELD] == [
        (c, "failed", "unknown_outcome: replay_window_passed") for c in HELD
    ]
    assert {r["status"] for r in rows if r["address"] not in HELD} == {"sent"}
    print(
        f"api sigkill past the window: calls={len(CUSTOMERS)} held_at_kill={len(HELD)}"
        f" second_calls=0 failed_replay_window_passed={len(HELD)}"
    )
