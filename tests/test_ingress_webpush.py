"""Web Push subscriptions through the send API: checked at the door as the push worker checks
them, then sent once to a browser's push service (the fake, which verifies VAPID and decrypts).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from consumers import InvalidPushJob, Settings, parse_push_job
from dedupe import DbConnection
from ingress.settings import IngressSettings
from providers.fakes import FakeApns, FakeFcm, FakeWebPush
from tests.harness import Harness
from tests.ingress_support import serve_in_process
from tests.support import wait_for
from tests.test_ingress_push import relaying
from tests.test_push_job_web import KEYS, b64
from tests.test_push_web import LOCAL, push_app, settled

PUBLIC = "https://push.example.com/send/abc"


def web(endpoint: str = PUBLIC, keys: Any = None, **more: Any) -> dict[str, Any]:
    return {"platform": "web", "endpoint": endpoint, "keys": KEYS if keys is None else keys, **more}


def job(*targets: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"targets": list(targets), "notification": {"title": "Shipped"}, **fields}


async def stored(db: DbConnection) -> tuple[int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM ingress_idempotency_keys), (SELECT count(*) FROM outbox)"
    )
    assert row is not None
    return row[0], row[1]


@pytest.fixture
async def http(db: DbConnection, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The send API in production's configuration: no Web Push host allowed."""
    async with (
        serve_in_process(db, settings.database, IngressSettings(queue="t.web")) as served,
        httpx.AsyncClient(
            base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
        ) as client,
    ):
        yield client


async def test_a_subscription_is_queued_as_the_browser_gave_it(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    target = web(expirationTime=None)  # PushSubscription.toJSON() has it
    answer = await http.post("/v1/messages", json={**job(target), "idempotency_key": "w-1"})
    assert answer.status_code == 202, answer.text
    body = json.loads(await db.fetchval("SELECT body FROM outbox"))
    assert body["targets"] == [target]  # what the worker reads, unchanged
    again = await http.post("/v1/messages", json={**job(target), "idempotency_key": "w-1"})
    assert again.json() == {"status": "duplicate_ignored", "id": answer.json()["id"]}
    assert await stored(db) == (1, 1)


BAD_POINT = b64(b"\x04" + b"\x01" * 64)  # 65 bytes, not on the curve


@pytest.mark.parametrize(
    ("target", "field", "words"),
    [
        (web("http://push.example.com/x"), "targets.0.endpoint", "an https URL"),
        (web("https://127.0.0.1:8443/push/x"), "targets.0.endpoint", "a public host"),
        (web("https://push.internal/x"), "targets.0.endpoint", "a public host"),
        (web("https://u:p@push.example.com/x"), "targets.0.endpoint", "no user or password"),
        (web(keys={**KEYS, "p256dh": BAD_POINT}), "targets.0.keys.p256dh", "P-256"),
        (web(keys={**KEYS, "auth": b64(b"x" * 17)}), "targets.0.keys.auth", "16-byte"),
        (web(keys={"p256dh": KEYS["p256dh"]}), "targets.0.keys.auth", "Field required"),
        (web(keys={**KEYS, "extra": "1"}), "targets.0.keys.extra", "Extra inputs"),
        (web(keys="k"), "targets.0.keys", "valid dictionary"),
        ({**web(), "token": "t"}, "targets.0.token", "Extra inputs"),
        ({"platform": "ios", "endpoint": PUBLIC, "keys": KEYS}, "targets.0.platform", "'web'"),
        ({"platform": "web"}, "targets.0.token", "Field required"),
    ],
    ids=[
        "http",
        "loopback",
        "special-use-name",
        "credentials",
        "p256dh-off-the-curve",
        "auth-17-bytes",
        "auth-missing",
        "keys-extra-field",
        "keys-not-an-object",
        "token-and-endpoint",
        "ios-subscription",
        "neither-shape",
    ],
)
async def test_a_subscription_the_worker_would_refuse_is_400_naming_its_field_and_stores_nothing(
    http: httpx.AsyncClient, db: DbConnection, target: dict[str, Any], field: str, words: str
) -> None:
    answer = await http.post("/v1/messages", json=job({"platform": "ios", "token": "t"}, target))
    assert answer.status_code == 400, answer.text
    details = answer.json()["details"]
    field = field.replace("targets.0", "targets.1")
    assert [d["field"] for d in details][:1] == [field], details
    assert words in details[0]["message"], details
    assert await stored(db) == (0, 0)


async def test_a_payload_too_large_once_encrypted_is_400_with_its_size(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    body = {**job(web()), "notification": {"title": "Shipped", "body": "x" * 4000}}
    with pytest.raises(InvalidPushJob) as worker:
        parse_push_job(body)
    answer = await http.post("/v1/messages", json=body, headers={"Idempotency-Key": "big"})
    assert answer.status_code == 400, answer.text
    [detail] = answer.json()["details"]
    assert detail["field"] == "notification"
    assert "bytes encrypted; push services take at most 4,096" in detail["message"]
    assert f"notification: {detail['message']}" == str(worker.value)  # the worker's words
    assert await stored(db) == (0, 0)
    fits = {**body, "notification": {"title": "Shipped", "body": "x" * 3000}}
    fitting = await http.post("/v1/messages", json=fits, headers={"Idempotency-Key": "fits"})
    assert fitting.status_code == 202, fitting.text


async def test_the_openapi_document_shows_the_token_and_the_subscription_shapes(
    http: httpx.AsyncClient,
) -> None:
    document = (await http.get("/openapi.json")).json()
    schemas = document["components"]["schemas"]
    shapes = schemas["SendRequest"]["properties"]["targets"]["items"]["oneOf"]
    assert [s["$ref"].rsplit("/", 1)[1] for s in shapes] == ["TokenTarget", "SubscriptionTarget"]
    assert schemas["SubscriptionTarget"]["required"] == ["platform", "endpoint", "keys"]
    assert schemas["SubscriptionKeys"]["required"] == ["p256dh", "auth"]


async def test_a_subscription_sent_through_the_api_reaches_the_browser_once(
    harness: Harness,
    settings: Settings,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> None:
    """POST -> outbox -> relay -> push worker -> the fake push service, which verifies the
    VAPID JWT and decrypts; a replayed POST sends nothing more. Door and worker allow the
    fake's 127.0.0.1 through the same setting (IW_WEBPUSH_ALLOW_HOSTS)."""
    browser = fake_webpush.subscribe("browser")
    body = {
        "targets": [{"platform": "ios", "token": "ios-token-1"}, browser.job_target()],
        "notification": {"title": "Shipped", "data": {"order": "1042"}},
        "idempotency_key": "order-1042",
    }
    worker_settings = replace(
        harness.settings, worker=replace(harness.settings.worker, webpush_allow_hosts=LOCAL)
    )
    ingress = IngressSettings(queue=harness.queue, webpush_allow_hosts=LOCAL)
    async with (
        serve_in_process(harness.db, settings.database, ingress) as served,
        httpx.AsyncClient(
            base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
        ) as http,
    ):
        first = await http.post("/v1/messages", json=body)
        assert first.status_code == 202, first.text
        message = first.json()["id"]
        app = push_app(harness.queue, fake_apns, fake_fcm, fake_webpush)
        async with harness.run(app, worker_settings), relaying(harness):
            await wait_for(lambda: settled(harness.db, 2))
            replay = await http.post("/v1/messages", json=body)
            assert replay.json() == {"status": "duplicate_ignored", "id": message}

            async def relayed() -> bool:
                return not await harness.db.fetchval(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                )

            await wait_for(relayed)
            view = (await http.get(f"/v1/messages/{message}")).json()
    [sent] = fake_webpush.requests_for(browser)
    assert sent.payload["title"] == "Shipped" and sent.payload["data"] == {"order": "1042"}
    assert fake_webpush.refusals == []
    assert len(fake_apns.requests_for("ios-token-1")) == 1
    assert await harness.db.fetchval("SELECT count(*) FROM outbox") == 1
    assert view["devices"] == {"sent": 2, "failed": 0, "pending": 0}
    web_target = view["targets"][1]
    assert (web_target["platform"], web_target["status"]) == ("webpush", "sent")
    assert web_target["provider_message_id"] == fake_webpush.pending(browser)[0].location
    assert web_target["address"] == browser.endpoint[:6] + "…"  # an endpoint is a credential
