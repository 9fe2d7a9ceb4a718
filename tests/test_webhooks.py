"""Webhook jobs through the send ledger: a real worker, RabbitMQ, PostgreSQL and HTTP.

Every delivery is verified on arrival by the `standardwebhooks` package in the test
receiver (`providers.fakes.webhooks`), never by our code.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from consumers import (
    App,
    ConfigurationError,
    Context,
    Settings,
    WebhookSettings,
    Worker,
    webhook_job_body,
)
from consumers.broker.topology import delete
from consumers.jobs.webhook_endpoints import secret_box
from dedupe import WebhookEndpoints
from providers.fakes.webhooks import ReceiverReply, WebhookReceiver
from proving.deadlines import ANSWER_S, within
from tests.harness import Harness
from tests.support import wait_for
from tests.webhook_support import (
    KEY,
    LOCAL,
    RETRY,
    add_endpoint,
    expected_id,
    ledger,
    settled,
    webhook_app,
    webhook_settings,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The worker's settings with the key (IW_WEBHOOK_SECRETS_KEY) and local http allowed."""
    return replace(settings, webhooks=WebhookSettings(secrets_keys=(KEY,), allow_http_hosts=LOCAL))


def job(n: int = 1042, *, endpoints: list[str] | None = None) -> dict[str, object]:
    return webhook_job_body(
        event_type="order.shipped",
        payload={"order": str(n)},
        timestamp="2026-03-01T12:00:00Z",
        endpoints=endpoints,
    )


async def test_a_job_reaches_every_subscribed_endpoint_of_its_tenant_once_signed(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    every = await add_endpoint(db, schema, webhook_receiver, "/every")
    shipped = await add_endpoint(
        db, schema, webhook_receiver, "/shipped", event_types=("order.shipped",)
    )
    await add_endpoint(db, schema, webhook_receiver, "/paid", event_types=("invoice.paid",))
    await add_endpoint(db, schema, webhook_receiver, "/globex", tenant="globex")
    async with harness.run(webhook_app(harness.queue)):
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await harness.publish(job(), message_id="nobody-1", tenant="nobody")
        await wait_for(lambda: settled(db, 2))
        await harness.wait_outcome("effect_committed", 2)
    sent = {d.path: d for d in webhook_receiver.deliveries}
    assert sorted(sent) == ["/every", "/shipped"]
    assert [d.verified for d in webhook_receiver.deliveries] == [True, True]
    for endpoint in (every, shipped):
        got = sent[endpoint.path]
        assert got.webhook_id == expected_id(harness.queue, "acme", "order-1042-shipped", endpoint)
        assert json.loads(got.body) == {
            "type": "order.shipped",
            "timestamp": "2026-03-01T12:00:00Z",
            "data": {"order": "1042"},
        }
    rows = await ledger(db)
    assert [(r["address"], r["status"], r["sends"]) for r in rows] == [
        (every.id, "sent", 1),
        (shipped.id, "sent", 1),
    ]
    assert {r["provider_message_id"] for r in rows} == {d.webhook_id for d in sent.values()}
    assert [e["tenant"] for e in harness.logs if e["event"] == "webhook_without_endpoint"] == [
        "nobody"
    ]


async def test_a_job_naming_endpoints_goes_to_those_of_its_tenant_only(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    paid = await add_endpoint(db, schema, webhook_receiver, "/paid", event_types=("invoice.paid",))
    await add_endpoint(db, schema, webhook_receiver, "/other")
    theirs = await add_endpoint(db, schema, webhook_receiver, "/globex", tenant="globex")
    async with harness.run(webhook_app(harness.queue)):
        body = job(endpoints=[paid.id, theirs.id])
        await harness.publish(body, message_id="named-1", tenant="acme")
        await wait_for(lambda: settled(db, 1))
    assert [d.path for d in webhook_receiver.deliveries] == ["/paid"]
    skipped = [e for e in harness.logs if e["event"] == "webhook_endpoints_skipped"]
    assert [e["endpoints"] for e in skipped] == [[theirs.id]]


async def test_a_redelivered_webhook_job_sends_nothing_again(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    await add_endpoint(harness.db, schema, webhook_receiver, "/hook")
    async with harness.run(webhook_app(harness.queue)):
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await wait_for(lambda: settled(harness.db, 1))
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await harness.wait_outcome("duplicate_ignored", 2)
    assert list(webhook_receiver.counts().values()) == [1]


async def test_a_retry_after_a_5xx_or_a_timeout_carries_the_same_webhook_id(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    failing = await add_endpoint(db, schema, webhook_receiver, "/failing")
    silent = await add_endpoint(db, schema, webhook_receiver, "/silent")
    webhook_receiver.script("/failing", ReceiverReply(status=503), times=1)
    webhook_receiver.script("/silent", ReceiverReply(hold=True), times=1)  # past the timeout
    async with harness.run(webhook_app(harness.queue, timeout=1.0)):
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await wait_for(lambda: settled(db, 2))
    for endpoint in (failing, silent):
        got = webhook_receiver.for_path(endpoint.path)
        assert len(got) == 2 and all(d.verified for d in got)
        assert {d.webhook_id for d in got} == {
            expected_id(harness.queue, "acme", "order-1042-shipped", endpoint)
        }
    assert [(r["status"], r["sends"]) for r in await ledger(db)] == [("sent", 2), ("sent", 2)]
    deferred = sorted(str(e["reason"]) for e in harness.logs if e["event"] == "webhook_deferred")
    assert deferred[0].startswith("HTTP 503") and deferred[1].startswith("unknown_outcome")


async def test_a_429s_retry_after_picks_the_delay_tier_at_or_above_it(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    await add_endpoint(harness.db, schema, webhook_receiver, "/busy")
    webhook_receiver.script("/busy", ReceiverReply(status=429, retry_after="2"), times=1)
    async with harness.run(webhook_app(harness.queue)):
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await wait_for(lambda: settled(harness.db, 1))
    first, second = webhook_receiver.for_path("/busy")
    # Without the Retry-After the first retry's backoff is at most 0.2 s (RETRY's base).
    assert second.received_at - first.received_at >= 2.0
    assert first.webhook_id == second.webhook_id
    assert [e["delay_s"] for e in harness.logs if e["event"] == "retry_scheduled"] == [2.0]


async def test_410_disables_the_endpoint_and_later_jobs_skip_it(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    gone = await add_endpoint(db, schema, webhook_receiver, "/gone")
    await add_endpoint(db, schema, webhook_receiver, "/alive")
    webhook_receiver.script("/gone", ReceiverReply(status=410))
    async with harness.run(webhook_app(harness.queue)):
        await harness.publish(job(1), message_id="order-1-shipped", tenant="acme")
        await wait_for(lambda: settled(db, 2))
        await harness.publish(job(2), message_id="order-2-shipped", tenant="acme")
        await wait_for(lambda: settled(db, 3))
    assert len(webhook_receiver.for_path("/gone")) == 1
    assert len(webhook_receiver.for_path("/alive")) == 2
    [endpoint] = [e for e in await WebhookEndpoints(schema).endpoints(db) if e.id == gone.id]
    assert endpoint.disabled_reason == "gone: HTTP 410"
    rows = [(r["message_id"], r["address"], r["status"]) for r in await ledger(db)]
    assert (("order-1-shipped", gone.id, "failed")) in rows
    assert all(address != gone.id for message, address, _ in rows if message == "order-2-shipped")
    disabled = [e for e in harness.logs if e["event"] == "webhook_endpoint_disabled"]
    assert [(e["endpoint"], e["reason"]) for e in disabled] == [(gone.id, "gone: HTTP 410")]


async def test_an_endpoint_disabled_before_a_retry_is_not_called_again(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    endpoint = await add_endpoint(db, schema, webhook_receiver, "/flaky")
    webhook_receiver.script("/flaky", ReceiverReply(status=503, retry_after="2"), times=1)
    async with harness.run(webhook_app(harness.queue, cache=0)):
        await harness.publish(job(), message_id="order-1042-shipped", tenant="acme")
        await harness.wait_outcome("retry_scheduled")  # the 503 is recorded; back in 2 s
        assert await WebhookEndpoints(schema).disable(db, endpoint.id, reason="by an operator")
        await wait_for(lambda: settled(db, 1))
    assert len(webhook_receiver.for_path("/flaky")) == 1
    [row] = await ledger(db)
    assert (row["status"], row["failure_reason"]) == ("failed", "endpoint_disabled: by an operator")


async def test_while_a_secret_rotates_the_old_and_the_new_each_verify_then_the_new_alone(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    store, box = WebhookEndpoints(schema), secret_box((KEY,))
    endpoint = await add_endpoint(db, schema, webhook_receiver, "/rotating")
    old = endpoint.secret
    new = await store.rotate(db, endpoint.id, overlap=timedelta(hours=1), box=box)
    assert new is not None
    webhook_receiver.trust("/rotating", old, new)  # each on its own: two receivers' views
    async with harness.run(webhook_app(harness.queue, cache=0)):
        await harness.publish(job(1), message_id="order-1-shipped", tenant="acme")
        await wait_for(lambda: settled(db, 1))
        newest = await store.rotate(db, endpoint.id, overlap=timedelta(0), box=box)
        assert newest is not None
        webhook_receiver.trust("/rotating", old, new, newest)
        await harness.publish(job(2), message_id="order-2-shipped", tenant="acme")
        await wait_for(lambda: settled(db, 2))
    during, after = webhook_receiver.for_path("/rotating")
    assert set(during.verified_with) == {old, new}
    assert after.verified_with == (newest,)
    logged = repr(harness.logs)
    for secret in (old, new, newest):
        assert secret not in logged and secret.removeprefix("whsec_") not in logged


async def test_a_webhook_emitted_by_a_handler_arrives_once_iff_its_effects_committed(
    harness: Harness, schema: str, webhook_receiver: WebhookReceiver
) -> None:
    db = harness.db
    await add_endpoint(db, schema, webhook_receiver, "/orders")
    orders = f"{harness.queue}.orders"
    app = webhook_app(harness.queue)

    @app.handler(orders)
    async def ship(ctx: Context) -> None:
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ($1, $2, $3, $4, 0)",
            ctx.consumer,
            ctx.tenant,
            ctx.message_id,
            str(ctx.body["n"]),
        )
        body = webhook_job_body(event_type="order.shipped", payload={"order": ctx.body["n"]})
        await ctx.emit(harness.queue, body, message_id=f"{ctx.message_id}:webhook")
        if ctx.body.get("fail"):
            raise RuntimeError("the handler failed after emitting")

    relaying = replace(harness.settings, relay=replace(harness.settings.relay, in_run=True))
    try:
        async with harness.run(app, relaying):
            for n in range(3):
                await harness.publisher.publish(orders, {"n": n}, message_id=f"o{n}", tenant="acme")
            await harness.publisher.publish(
                orders, {"n": 99, "fail": True}, message_id="o99", tenant="acme"
            )
            await wait_for(lambda: settled(db, 3))
            await harness.wait_outcome("dead_lettered")  # o99, its attempts spent
    finally:
        await within(ANSWER_S, "the orders queue's deletion", _delete(harness, orders))
    arrived = sorted(json.loads(d.body)["data"]["order"] for d in webhook_receiver.deliveries)
    assert arrived == [0, 1, 2]
    assert list(webhook_receiver.counts().values()) == [1, 1, 1]
    assert await harness.effects() == 3


async def _delete(harness: Harness, queue: str) -> None:
    await delete(harness.channel, queue, RETRY)


async def test_a_worker_without_the_key_refuses_to_start(harness: Harness) -> None:
    keyless = replace(harness.settings, webhooks=WebhookSettings(allow_http_hosts=LOCAL))
    app = App(retry=RETRY)
    app.webhook_handler(harness.queue, settings=webhook_settings())
    worker = Worker(app, keyless)
    try:
        with pytest.raises(ConfigurationError, match="IW_WEBHOOK_SECRETS_KEY is not set"):
            await worker.start()
    finally:
        await worker.stop()  # what `run` does with a failed start: close what it opened
