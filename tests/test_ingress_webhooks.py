"""POST /v1/webhooks over real HTTP: the idempotency-key contract of POST /v1/messages, the
webhook worker's own rules at the door, and one webhook through serve, the relay and a worker
to a receiver that verifies its signature with the `standardwebhooks` package.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers import InvalidWebhookJob, Settings, WebhookSettings, parse_webhook_job
from dedupe import DbConnection, fingerprint
from ingress.accept import fingerprint_of
from ingress.body import decode_body
from ingress.client import JobKind, Refused, SendClient
from ingress.refusals import Refusal
from ingress.serve import serve_settings
from ingress.settings import IngressSettings
from ingress.webhooks import webhook_job
from providers.fakes.webhooks import WebhookReceiver
from tests.harness import Harness
from tests.ingress_support import Served, serve_in_process
from tests.support import wait_for
from tests.test_ingress_push import relaying
from tests.webhook_support import KEY, LOCAL, Endpoint, expected_id, webhook_app

pytestmark = pytest.mark.timeout(120)

WEBHOOKS = WebhookSettings(secrets_keys=(KEY,), allow_http_hosts=LOCAL)
EVENT: dict[str, Any] = {"event_type": "order.shipped", "payload": {"order": "1042"}}
PUSH: dict[str, Any] = {"targets": [{"platform": "ios", "token": "ios-token-1"}]}


async def counts(db: DbConnection) -> tuple[int, int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM ingress_idempotency_keys),"
        " (SELECT count(*) FROM ingress_messages), (SELECT count(*) FROM outbox)"
    )
    assert row is not None
    return row[0], row[1], row[2]


def client(served: Served, key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=served.url, headers={"Authorization": f"Bearer {key or served.key}"}, timeout=30
    )


@pytest.fixture
async def served(db: DbConnection, settings: Settings) -> AsyncIterator[Served]:
    ingress = IngressSettings(queue="t.push", webhook_queue="t.hooks")
    async with serve_in_process(db, settings.database, ingress, webhook_settings=WEBHOOKS) as s:
        yield s


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with client(served) as c:
        yield c


async def test_a_webhook_is_queued_and_its_replay_answers_the_first_id(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    before = datetime.now(UTC)
    first = await http.post("/v1/webhooks", json=EVENT, headers={"Idempotency-Key": "hook-1"})
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "queued" and "idempotent-replayed" not in first.headers
    message = first.json()["id"]
    row = await db.fetchrow("SELECT queue, tenant, message_id, headers, body FROM outbox")
    assert row is not None
    assert (row["queue"], row["tenant"], row["message_id"]) == (
        "t.hooks",
        "acme",
        f"ingress-{message}",
    )
    assert json.loads(row["headers"]) == {"x-ingress-message": message}
    job = json.loads(row["body"])
    # the key left out; the time it was taken set once, so every delivery sends the same bytes
    assert {k: v for k, v in job.items() if k != "timestamp"} == EVENT
    assert before <= datetime.fromisoformat(job["timestamp"]) <= datetime.now(UTC)
    parse_webhook_job(job)  # what a webhook worker takes

    again = await http.post("/v1/webhooks", json={**EVENT, "idempotency_key": "hook-1"})
    assert again.status_code == 202
    assert again.json() == {"status": "duplicate_ignored", "id": message}
    assert again.headers["idempotent-replayed"] == "true"
    other = {**EVENT, "payload": {"order": "1043"}}
    reused = await http.post("/v1/webhooks", json=other, headers={"Idempotency-Key": "hook-1"})
    assert (reused.status_code, reused.json()) == (422, {"error": "idempotency_key_reused"})
    assert await counts(db) == (1, 1, 1)
    view = (await http.get(f"/v1/messages/{message}")).json()
    assert (view["status"], view["targets"]) == ("queued", [])  # endpoints: the worker's choice


async def test_a_key_is_the_tenants_across_kinds_a_push_key_is_reused_for_a_webhook(
    served: Served, http: httpx.AsyncClient, db: DbConnection
) -> None:
    pushed = await http.post("/v1/messages", json=PUSH, headers={"Idempotency-Key": "k-1"})
    assert pushed.status_code == 202, pushed.text
    as_webhook = await http.post("/v1/webhooks", json=EVENT, headers={"Idempotency-Key": "k-1"})
    assert (as_webhook.status_code, as_webhook.json()["error"]) == (422, "idempotency_key_reused")
    hooked = await http.post("/v1/webhooks", json=EVENT, headers={"Idempotency-Key": "k-2"})
    assert hooked.status_code == 202, hooked.text
    as_push = await http.post("/v1/messages", json=PUSH, headers={"Idempotency-Key": "k-2"})
    assert (as_push.status_code, as_push.json()["error"]) == (422, "idempotency_key_reused")
    async with client(served, served.other_key) as globex:  # another tenant's keys are its own
        theirs = await globex.post("/v1/webhooks", json=EVENT, headers={"Idempotency-Key": "k-1"})
    assert (theirs.status_code, theirs.json()["status"]) == (202, "queued")
    assert await counts(db) == (3, 3, 3)


def test_the_fingerprint_is_of_the_body_and_its_kind_and_a_pushs_is_as_it_was() -> None:
    body = {"event_type": "order.shipped", "payload": None}
    assert fingerprint_of("webhook", body) != fingerprint_of("email", body)
    assert fingerprint_of("webhook", body) == fingerprint({"kind": "webhook", "job": body})
    assert fingerprint_of("push", PUSH) == fingerprint(PUSH)  # keys stored before still answer


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({**EVENT, "event_type": "order shipped"}, "event_type"),
    ({**EVENT, "event_type": "o" * 201}, "event_type"),
    ({**EVENT, "event_type": 7}, "event_type"),
    ({"event_type": "order.shipped"}, "payload"),
    ({**EVENT, "timestamp": "yesterday"}, "timestamp"),
    ({**EVENT, "timestamp": "2026-02-30T12:00:00Z"}, "timestamp"),
    ({**EVENT, "timestamp": 1767225600}, "timestamp"),
    ({**EVENT, "endpoints": []}, "endpoints"),
    ({**EVENT, "endpoints": ["ep_a", "hook-2"]}, "endpoints.1"),
    ({**EVENT, "endpoints": [f"ep_{n}" for n in range(101)]}, "endpoints"),
    ({**EVENT, "endpoints": "ep_a"}, "endpoints"),
]


@pytest.mark.parametrize(("body", "field"), REFUSED)
async def test_a_webhook_the_worker_would_dead_letter_is_400_naming_its_field_and_stores_nothing(
    http: httpx.AsyncClient, db: DbConnection, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidWebhookJob):
        parse_webhook_job(body)  # the worker refuses it too
    answer = await http.post("/v1/webhooks", json=body, headers={"Idempotency-Key": "k"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request"
    assert answer.json()["details"][0]["field"] == field, answer.json()
    assert await counts(db) == (0, 0, 0)


async def test_unknown_fields_are_400_though_the_worker_would_ignore_them(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    """A misspelt `endpoint` would send to every endpoint: the door refuses it by name."""
    body = {**EVENT, "endpoint": "ep_a"}
    parse_webhook_job(body)  # the worker ignores it
    answer = await http.post("/v1/webhooks", json=body, headers={"Idempotency-Key": "k"})
    assert answer.status_code == 400
    assert answer.json()["details"] == [
        {"field": "endpoint", "message": "Extra inputs are not permitted"}
    ]
    assert await counts(db) == (0, 0, 0)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=4,
)
_webhook_bodies = st.fixed_dictionaries(
    {},
    optional={
        "event_type": st.one_of(st.sampled_from(["a", "a.b", "a..b", "a b", "", "é"]), _json),
        "payload": _json,
        "timestamp": st.one_of(
            st.sampled_from(["2026-03-01T12:00:00Z", "2026-03-01", "2026-13-01", "x", ""]), _json
        ),
        "endpoints": st.one_of(
            st.lists(st.sampled_from(["ep_a", "ep_b-1", "ep_", "ep a", "x"]), max_size=3), _json
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(_webhook_bodies)
def test_the_door_takes_a_webhook_body_exactly_when_the_worker_does(body: dict[str, Any]) -> None:
    """Bodies of the webhook job's fields (no unknown ones): the door and the worker's parser
    agree on every one, and what the door stores is what the worker reads."""
    try:
        parse_webhook_job(body)
        worker_takes = True
    except InvalidWebhookJob:
        worker_takes = False
    try:
        _, job = webhook_job(decode_body("application/json", json.dumps(body).encode()))
    except Refusal as refused:
        assert not worker_takes, (body, refused.body)
        return
    assert worker_takes, body
    assert parse_webhook_job(job).endpoints == parse_webhook_job(body).endpoints


async def test_without_a_webhook_queue_the_route_is_501_saying_how_to_serve_it(
    db: DbConnection, settings: Settings
) -> None:
    async with (
        serve_in_process(db, settings.database, IngressSettings(queue="t.push")) as served,
        client(served) as http,
    ):
        refused = await http.post("/v1/webhooks", json=EVENT, headers={"Idempotency-Key": "k"})
        unknown = await http.post(
            "/v1/webhooks", json=EVENT, headers={"Authorization": "Bearer iwk_wrong"}
        )
        pushed = await http.post("/v1/messages", json=PUSH, headers={"Idempotency-Key": "k"})
    assert refused.status_code == 501
    assert refused.json()["error"] == "kind_not_served"
    assert "--webhook-queue" in refused.json()["message"]
    assert "IW_INGRESS_WEBHOOK_QUEUE" in refused.json()["message"]
    assert unknown.status_code == 401  # the key first: a stranger learns nothing
    assert pushed.status_code == 202  # push is served as before
    assert await counts(db) == (1, 1, 1)


async def test_a_webhook_past_the_workers_limit_is_413_and_stores_nothing(
    db: DbConnection, settings: Settings
) -> None:
    ingress = IngressSettings(queue="t.push", webhook_queue="t.hooks", max_body_bytes=4096)
    async with (
        serve_in_process(db, settings.database, ingress) as served,
        client(served) as http,
    ):
        large = {**EVENT, "payload": {"note": "x" * 5000}}
        refused = await http.post("/v1/webhooks", json=large, headers={"Idempotency-Key": "k"})
        fits = {**EVENT, "payload": {"note": "x" * 3000}}
        taken = await http.post("/v1/webhooks", json=fits, headers={"Idempotency-Key": "k"})
        reader, writer = await asyncio.open_connection("127.0.0.1", int(served.url.rsplit(":")[-1]))
        writer.write(
            f"POST /v1/webhooks HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {served.key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
    assert refused.status_code == 413
    assert refused.json() == {"error": "body_too_large", "max_bytes": 4096}
    assert refused.headers["connection"] == "close"
    assert head.startswith(b"HTTP/1.1 413"), head  # announced: refused before a byte of it
    assert taken.status_code == 202
    assert await counts(db) == (1, 1, 1)


async def test_a_cancelled_webhook_is_sent_to_no_endpoint(
    harness: Harness, settings: Settings, webhook_receiver: WebhookReceiver
) -> None:
    ingress = IngressSettings(queue="t.push", webhook_queue=harness.queue)
    async with (
        serve_in_process(harness.db, settings.database, ingress, webhook_settings=WEBHOOKS) as s,
        client(s) as http,
    ):
        made = await http.post("/v1/webhook-endpoints", json={"url": webhook_receiver.url("/h")})
        webhook_receiver.trust("/h", made.json()["secret"])
        message = (
            await http.post("/v1/webhooks", json=EVENT, headers={"Idempotency-Key": "k"})
        ).json()["id"]
        assert (await http.post(f"/v1/messages/{message}/cancel")).status_code == 200
        worker = replace(harness.settings, webhooks=WEBHOOKS)
        async with harness.run(webhook_app(harness.queue), worker), relaying(harness):
            await harness.wait_outcome("message_cancelled", 1)
    assert webhook_receiver.deliveries == []


async def test_a_webhook_posted_with_curl_reaches_its_endpoint_once_and_a_replay_sends_nothing(
    harness: Harness, settings: Settings, webhook_receiver: WebhookReceiver
) -> None:
    """curl -> serve -> outbox -> relay -> webhook worker -> the receiver, which verifies the
    signature with `standardwebhooks` against the secret the endpoint route showed once."""
    ingress = IngressSettings(queue="t.push", webhook_queue=harness.queue)
    body = {**EVENT, "timestamp": "2026-03-01T12:00:00Z"}
    async with (
        serve_in_process(harness.db, settings.database, ingress, webhook_settings=WEBHOOKS) as s,
        client(s) as http,
    ):
        made = (
            await http.post(
                "/v1/webhook-endpoints",
                json={"url": webhook_receiver.url("/orders"), "event_types": ["order.shipped"]},
            )
        ).json()
        endpoint = Endpoint(id=made["id"], path="/orders", secret=made["secret"])
        webhook_receiver.trust(endpoint.path, endpoint.secret)
        posted = await asyncio.to_thread(
            subprocess.run,
            [
                "curl", "-sS", "-w", "\n%{http_code}",
                "-H", f"Authorization: Bearer {s.key}",
                "-H", "Content-Type: application/json",
                "-H", "Idempotency-Key: order-1042-shipped",
                "--data-binary", json.dumps(body),
                f"{s.url}/v1/webhooks",
            ],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        answer, status = posted.stdout.rsplit("\n", 1)
        assert status == "202", posted.stdout
        message = json.loads(answer)["id"]
        worker = replace(harness.settings, webhooks=WEBHOOKS)
        async with harness.run(webhook_app(harness.queue), worker), relaying(harness):

            async def delivered() -> bool:
                return len(webhook_receiver.deliveries) >= 1

            await wait_for(delivered)
            replay = await http.post(
                "/v1/webhooks", json=body, headers={"Idempotency-Key": "order-1042-shipped"}
            )
            assert replay.json() == {"status": "duplicate_ignored", "id": message}

            async def settled() -> bool:
                view = (await http.get(f"/v1/messages/{message}")).json()
                pending = await harness.db.fetchval(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                )
                return view["status"] == "taken" and view["devices"]["sent"] == 1 and not pending

            await wait_for(settled)
            await harness.wait_outcome("effect_committed", 1)
            view = (await http.get(f"/v1/messages/{message}")).json()
    [delivery] = webhook_receiver.deliveries
    assert delivery.verified and delivery.path == "/orders"
    webhook_id = expected_id(harness.queue, "acme", f"ingress-{message}", endpoint)
    assert delivery.webhook_id == webhook_id
    assert json.loads(delivery.body) == {
        "type": "order.shipped",
        "timestamp": "2026-03-01T12:00:00Z",
        "data": {"order": "1042"},
    }
    assert await harness.db.fetchval("SELECT count(*) FROM outbox") == 1
    assert view["devices"] == {"sent": 1, "failed": 0, "pending": 0}
    [target] = view["targets"]
    assert target == {
        "index": 0,
        "status": "sent",
        "platform": "webhook",
        "address": endpoint.id,
        "provider_message_id": webhook_id,
        "failure_reason": None,
    }


def test_the_webhook_queue_and_web_push_hosts_come_from_the_environment_and_the_flag_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The webhook queue from IW_INGRESS_WEBHOOK_QUEUE or --webhook-queue; the Web Push
    hosts from the settings the CLI read, as the workers take them (IW_WEBPUSH_ALLOW_HOSTS)."""
    monkeypatch.setenv("IW_INGRESS_WEBHOOK_QUEUE", "hooks.from-env")
    cli_settings = Settings.from_env({"IW_WEBPUSH_ALLOW_HOSTS": "127.0.0.1, Push.Local"})
    from_env = serve_settings([], cli_settings)
    flagged = serve_settings(["--webhook-queue", "hooks.from-flag"])
    assert from_env.webhook_queue == "hooks.from-env"
    assert from_env.webpush_allow_hosts == frozenset({"127.0.0.1", "push.local"})
    assert flagged.webhook_queue == "hooks.from-flag"
    assert flagged.webpush_allow_hosts == frozenset()
    monkeypatch.delenv("IW_INGRESS_WEBHOOK_QUEUE")
    assert serve_settings([]).webhook_queue is None  # POST /v1/webhooks: 501


async def test_the_client_sends_a_webhook_with_one_key_per_intent(served: Served) -> None:
    async with SendClient(served.url, api_key=served.key) as client:
        first = await client.send(EVENT, idempotency_key="c-1", kind=JobKind.WEBHOOK)
        again = await client.send(EVENT, idempotency_key="c-1", kind=JobKind.WEBHOOK)
        with pytest.raises(Refused) as as_push:
            await client.send(PUSH, idempotency_key="c-1")
    assert (first.status, again.status, again.id) == ("queued", "duplicate_ignored", first.id)
    assert again.replayed
    assert (as_push.value.status, as_push.value.error) == (422, "idempotency_key_reused")
