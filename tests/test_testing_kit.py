"""The test kit users get (`consumers.testing`): their App on the real services, then nothing left.

Each test runs a user's app through the `worker_for` fixture, as a user's
own test would, and checks what the kit promises: every outcome is awaited by
its message_id with a deadline, a wrong outcome fails at once naming what was
awaited and what came instead, and the queues (work, retry tiers, dead
letters) and the schema it made are gone afterwards, also when the test's
body failed.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import aio_pika
import aiormq
import asyncpg
import pytest
import structlog

from consumers import App, Context, Reject, RetryPolicy
from consumers.handlers.retry import dead_letter_queue, tier_queue
from consumers.testing import OutcomeNotSeen, Services, TestWorker, WorkerFor
from providers import Platform
from providers.apns import ApnsProvider
from providers.fakes import FakeApns
from proving.deadlines import ANSWER_S

FAST = RetryPolicy(max_attempts=3, base_seconds=0.1, tiers_seconds=(0.1, 0.2))
SHIPMENTS = "CREATE TABLE shipments (order_id bigint NOT NULL, tenant text NOT NULL)"


def shipments_app() -> App:
    """Records a shipment; `reject` in the body dead-letters it, `flaky` fails its first attempt."""
    app = App(retry=FAST)

    @app.handler("orders.shipped")
    async def record(ctx: Context) -> None:
        if "reject" in ctx.body:
            raise Reject(reason=str(ctx.body["reject"]))
        if ctx.body.get("flaky") and ctx.attempt == 1:
            raise ConnectionError("the carrier did not answer")
        await ctx.tx.execute(
            "INSERT INTO shipments (order_id, tenant) VALUES ($1, $2)",
            ctx.body["order_id"],
            ctx.tenant,
        )
        await ctx.emit(
            "orders.notify", {"order_id": ctx.body["order_id"]}, message_id=f"{ctx.message_id}:n"
        )

    return app


def the_queues_of(worker: TestWorker) -> list[str]:
    """Every queue the worker's app needs on the broker: work queue, retry tiers, dead letters."""
    return [
        name
        for queue, spec in worker.app.specs.items()
        for name in (
            queue,
            dead_letter_queue(queue),
            *(tier_queue(queue, tier) for tier in spec.retry.tiers_seconds),
        )
    ]


async def queues_left(services: Services, names: list[str]) -> list[str]:
    """Those of `names` the broker still has (a passive declare of each)."""
    left = []
    connection = await aio_pika.connect(services.amqp_url, timeout=ANSWER_S)
    async with connection:
        for name in names:
            channel = await connection.channel()
            try:
                await channel.declare_queue(name, passive=True, timeout=ANSWER_S)
                left.append(name)
            except aiormq.exceptions.ChannelNotFoundEntity:
                pass
    return left


def broker_queues_starting(prefix: str) -> list[str]:
    """Every queue on the broker whose name starts with `prefix` (rabbitmqctl)."""
    out = subprocess.run(
        ["rabbitmqctl", "list_queues", "name", "-q", "--no-table-headers"],
        capture_output=True,
        text=True,
        check=True,
        timeout=ANSWER_S,
    ).stdout
    return [line.strip() for line in out.splitlines() if line.strip().startswith(prefix)]


async def schema_exists(services: Services, schema: str) -> bool:
    conn = await asyncpg.connect(services.database_url, timeout=ANSWER_S)
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema, timeout=ANSWER_S
        )
    finally:
        await conn.close(timeout=ANSWER_S)
    return bool(found)


async def test_a_message_is_seen_committed_and_its_repeat_duplicate_ignored(
    worker_for: WorkerFor,
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"order_id": 7}, message_id="ship-7", tenant="acme")
        committed = await worker.committed("ship-7", tenant="acme")
        await worker.publish("orders.shipped", {"order_id": 7}, message_id="ship-7", tenant="acme")
        duplicate = await worker.duplicate_ignored("ship-7", tenant="acme")
        rows = await worker.db.fetch("SELECT order_id, tenant FROM shipments")
    assert (committed.queue, committed.tenant, committed.attempt) == ("orders.shipped", "acme", 1)
    assert duplicate.outcome == "duplicate_ignored"
    assert [tuple(r) for r in rows] == [(7, "acme")]


async def test_the_same_message_id_in_two_tenants_is_two_messages(worker_for: WorkerFor) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        for tenant in ("acme", "globex"):
            await worker.publish("orders.shipped", {"order_id": 1}, message_id="m", tenant=tenant)
        for tenant in ("acme", "globex"):
            await worker.committed("m", tenant=tenant)
        assert await worker.db.fetchval("SELECT count(*) FROM shipments") == 2


async def test_a_failing_first_attempt_is_seen_retried_then_committed(
    worker_for: WorkerFor,
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"order_id": 8, "flaky": True}, message_id="m-8")
        retried = await worker.retried("m-8", attempt=1)
        committed = await worker.committed("m-8")
    assert retried.reason == "handler_error"
    assert retried.error == "ConnectionError: the carrier did not answer"
    assert retried.delay_s in FAST.tiers_seconds
    assert committed.attempt == 2


async def test_rejected_and_reused_messages_are_seen_dead_lettered_with_their_reasons(
    worker_for: WorkerFor,
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"reject": "no_address"}, message_id="m-9")
        rejected = await worker.dead_lettered("m-9", reason="no_address")
        await worker.publish("orders.shipped", {"order_id": 10}, message_id="m-10")
        await worker.committed("m-10")
        await worker.publish("orders.shipped", {"order_id": 11}, message_id="m-10")
        reused = await worker.dead_lettered("m-10")
    assert (rejected.outcome, rejected.reason) == ("dead_lettered", "no_address")
    assert (reused.outcome, reused.reason) == ("message_id_reused", "message_id_reused")


async def test_a_wrong_outcome_fails_at_once_naming_what_was_awaited_and_what_came(
    worker_for: WorkerFor,
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"reject": "no_address"}, message_id="m-1")
        started = asyncio.get_running_loop().time()
        with pytest.raises(OutcomeNotSeen) as raised:
            await worker.committed("m-1", timeout=60)
        waited = asyncio.get_running_loop().time() - started
    text = str(raised.value)
    assert "effect_committed of message 'm-1'" in text, text
    assert "dead_lettered" in text and "no_address" in text, text
    assert waited < 30, f"waited {waited:.1f} s for an outcome that could no longer come"


async def test_an_outcome_that_never_comes_fails_at_its_deadline_saying_so(
    worker_for: WorkerFor,
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"order_id": 3}, message_id="m-3")
        await worker.committed("m-3")
        with pytest.raises(OutcomeNotSeen) as raised:
            await worker.committed("never-published", timeout=0.3)
    text = str(raised.value)
    assert "effect_committed of message 'never-published'" in text, text
    assert "within 0.3 s" in text and "nothing" in text, text
    assert "m-3" in text, "the lines that did come are named"


async def test_a_handlers_follow_ups_stay_in_the_temporary_outbox(worker_for: WorkerFor) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"order_id": 4}, message_id="m-4", tenant="acme")
        await worker.committed("m-4", tenant="acme")
        emitted = await worker.emitted()
    assert [(e.queue, e.message_id, e.tenant, e.json()) for e in emitted] == [
        ("orders.notify", "m-4:n", "acme", {"order_id": 4})
    ]


async def test_publishing_to_a_queue_the_app_lacks_is_refused_naming_its_queues(
    worker_for: WorkerFor,
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        with pytest.raises(KeyError, match=r"orders\.shiped.*orders\.shipped"):
            await worker.publish("orders.shiped", {"order_id": 1}, message_id="m")


async def test_two_kits_at_once_keep_to_their_own_queues(worker_for: WorkerFor) -> None:
    app = shipments_app()
    async with (
        worker_for(app, setup_sql=SHIPMENTS) as one,
        worker_for(app, setup_sql=SHIPMENTS) as two,
    ):
        assert set(the_queues_of(one)).isdisjoint(the_queues_of(two))
        await one.publish("orders.shipped", {"order_id": 1}, message_id="same")
        await two.publish("orders.shipped", {"order_id": 2}, message_id="same")
        await one.committed("same")
        await two.committed("same")
        assert await one.db.fetchval("SELECT order_id FROM shipments") == 1
        assert await two.db.fetchval("SELECT order_id FROM shipments") == 2


async def test_the_kit_leaves_no_queue_and_no_schema_behind(
    worker_for: WorkerFor, worker_services: Services
) -> None:
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"order_id": 5, "flaky": True}, message_id="m-5")
        await worker.retried("m-5")  # a tier queue held it
        await worker.committed("m-5")
        queues = the_queues_of(worker)
        assert len(queues) == 4  # orders.shipped, its .dlq and two tiers
        assert await queues_left(worker_services, queues) == queues
        if shutil.which("rabbitmqctl"):
            assert sorted(broker_queues_starting(worker.prefix)) == sorted(queues)
    assert await queues_left(worker_services, queues) == []
    assert not await schema_exists(worker_services, worker.schema)
    if shutil.which("rabbitmqctl"):
        assert broker_queues_starting(worker.prefix) == []


async def test_the_kit_cleans_up_when_the_test_body_fails(
    worker_for: WorkerFor, worker_services: Services
) -> None:
    with pytest.raises(ZeroDivisionError):
        async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
            await worker.publish("orders.shipped", {"order_id": 6}, message_id="m-6")
            await worker.committed("m-6")
            _ = 1 / 0
    assert await queues_left(worker_services, the_queues_of(worker)) == []
    assert not await schema_exists(worker_services, worker.schema)
    if shutil.which("rabbitmqctl"):
        assert broker_queues_starting(worker.prefix) == []


async def test_the_kit_cleans_up_when_the_app_cannot_start(
    worker_for: WorkerFor, worker_services: Services
) -> None:
    worker = worker_for(shipments_app(), setup_sql="CREATE TABLE broken (")
    with pytest.raises(asyncpg.PostgresSyntaxError):
        async with worker:
            pass
    assert await queues_left(worker_services, the_queues_of(worker)) == []
    assert not await schema_exists(worker_services, worker.schema)


async def test_the_kit_leaves_structlog_as_it_found_it(worker_for: WorkerFor) -> None:
    before = list(structlog.get_config()["processors"])
    async with worker_for(shipments_app(), setup_sql=SHIPMENTS) as worker:
        await worker.publish("orders.shipped", {"order_id": 2}, message_id="m-2")
        await worker.committed("m-2")
    assert list(structlog.get_config()["processors"]) == before


async def test_a_push_job_through_the_fake_apns_is_committed_and_sent_once(
    worker_for: WorkerFor, fake_apns: FakeApns
) -> None:
    async def apns() -> ApnsProvider:
        return ApnsProvider(fake_apns.settings())

    app = App(retry=FAST)
    app.push_handler("welcome.push", provider=apns)
    job = {
        "targets": [{"platform": str(Platform.IOS), "token": "a1b2c3"}],
        "notification": {"title": "Welcome"},
    }
    async with worker_for(app) as worker:
        await worker.publish("welcome.push", job, message_id="welcome-1")
        await worker.committed("welcome-1")
        await worker.publish("welcome.push", job, message_id="welcome-1")
        await worker.duplicate_ignored("welcome-1")
    assert len(fake_apns.requests_for("a1b2c3")) == 1
