"""The API key's tenant's webhook endpoints over real HTTP: a secret shown once, every route
scoped to the tenant, the CLI's store and rules, and no secret in the logs of `serve`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet

from consumers import Settings, WebhookSettings
from dedupe import DbConnection, WebhookEndpoints
from ingress.endpoints import MAX_BODY_BYTES
from ingress.settings import IngressSettings
from tests.conftest import DATABASE_URL
from tests.ingress_support import Served, serve_in_process
from tests.support import ROOT
from tests.test_ingress_serve import cli, started
from tests.webhook_support import KEY, LOCAL

WEBHOOKS = WebhookSettings(secrets_keys=(KEY,), allow_http_hosts=LOCAL)
URL = "https://hooks.example.com/orders"


@pytest.fixture
async def served(db: DbConnection, settings: Settings) -> AsyncIterator[Served]:
    ingress = IngressSettings(queue="t.push", webhook_queue="t.hooks")
    async with serve_in_process(db, settings.database, ingress, webhook_settings=WEBHOOKS) as s:
        yield s


def client(served: Served, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=served.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


@pytest.fixture
async def acme(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with client(served, served.key) as c:
        yield c


@pytest.fixture
async def globex(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with client(served, served.other_key) as c:
        yield c


async def add(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    made = await http.post("/v1/webhook-endpoints", json={"url": URL, **fields})
    assert made.status_code == 201, made.text
    answer: dict[str, Any] = made.json()
    return answer


async def test_an_endpoint_is_made_for_the_keys_tenant_and_its_secret_shown_once(
    acme: httpx.AsyncClient, db: DbConnection, schema: str
) -> None:
    made = await add(acme, event_types=["order.shipped", "order.paid"])
    secret = made["secret"]
    assert secret.startswith("whsec_") and len(secret) == 50
    assert made["state"] == "enabled" and made["url"] == URL
    assert made["event_types"] == ["order.paid", "order.shipped"]
    assert [s["prefix"] for s in made["secrets"]] == [secret[:10] + "…"]
    listed = await acme.get("/v1/webhook-endpoints")
    one = await acme.get(f"/v1/webhook-endpoints/{made['id']}")
    for answer in (listed, one):
        assert answer.status_code == 200
        assert secret not in answer.text and secret[10:] not in answer.text
    assert [e["id"] for e in listed.json()["endpoints"]] == [made["id"]]
    assert "secret" not in one.json()
    # The CLI's store: `webhook endpoint list` sees it, the tenant's, encrypted at rest.
    [stored] = await WebhookEndpoints(schema).endpoints(db)
    assert (stored.id, stored.tenant, stored.url) == (made["id"], "acme", URL)
    ciphertext = await db.fetchval("SELECT ciphertext FROM webhook_secrets")
    assert secret.encode() not in bytes(ciphertext)
    assert Fernet(KEY).decrypt(ciphertext).decode() == secret


async def test_another_tenants_endpoint_is_404_on_every_route_and_stays_as_it_was(
    acme: httpx.AsyncClient, globex: httpx.AsyncClient, db: DbConnection
) -> None:
    theirs = await add(globex)
    mine = await add(acme)
    base = f"/v1/webhook-endpoints/{theirs['id']}"
    answers = [
        await acme.get(base),
        await acme.post(f"{base}/rotate"),
        await acme.post(f"{base}/disable"),
        await acme.post(f"{base}/enable"),
        await acme.delete(base),
    ]
    assert [(a.status_code, a.json()) for a in answers] == [(404, {"error": "not_found"})] * 5
    listed = (await acme.get("/v1/webhook-endpoints")).json()["endpoints"]
    assert [e["id"] for e in listed] == [mine["id"]]
    still = (await globex.get(base)).json()
    assert still["state"] == "enabled" and len(still["secrets"]) == 1
    assert await db.fetchval("SELECT count(*) FROM webhook_secrets") == 2


async def test_rotate_shows_the_new_secret_once_and_the_old_one_signs_beside_it_a_while(
    acme: httpx.AsyncClient, db: DbConnection
) -> None:
    made = await add(acme)
    rotated = await acme.post(
        f"/v1/webhook-endpoints/{made['id']}/rotate", json={"overlap_hours": 2}
    )
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["secret"]
    assert new.startswith("whsec_") and new != made["secret"]
    newest, old = rotated.json()["secrets"]
    assert (newest["prefix"], newest["expires_at"]) == (new[:10] + "…", None)
    assert old["prefix"] == made["secret"][:10] + "…" and old["expires_at"] is not None
    again = await acme.post(f"/v1/webhook-endpoints/{made['id']}/rotate", json={"overlap_hours": 0})
    assert [s["prefix"] for s in again.json()["secrets"]] == [again.json()["secret"][:10] + "…"]
    listed = (await acme.get("/v1/webhook-endpoints")).text
    assert all(s not in listed for s in (made["secret"], new, again.json()["secret"]))
    refused = await acme.post(
        f"/v1/webhook-endpoints/{made['id']}/rotate", json={"overlap_hours": -1}
    )
    assert refused.status_code == 400
    assert refused.json()["details"][0]["field"] == "overlap_hours"


async def test_disable_and_enable_answer_the_state_whatever_it_was_and_delete_removes(
    acme: httpx.AsyncClient, db: DbConnection
) -> None:
    made = await add(acme)
    base = f"/v1/webhook-endpoints/{made['id']}"
    states = []
    for action in ("disable", "disable", "enable", "enable"):
        answer = await acme.post(f"{base}/{action}")
        assert answer.status_code == 200, answer.text
        states.append((answer.json()["state"], answer.json()["disabled_reason"]))
    assert states == [
        ("disabled", "disabled through the send API"),
        ("disabled", "disabled through the send API"),
        ("enabled", None),
        ("enabled", None),
    ]
    deleted = await acme.delete(base)
    assert (deleted.status_code, deleted.content) == (204, b"")
    assert (await acme.delete(base)).status_code == 404
    assert (await acme.get(base)).status_code == 404
    assert await db.fetchval("SELECT count(*) FROM webhook_secrets") == 0


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"url": "http://hooks.example.com/x"}, "url", "https only"),
        ({"url": "https://u:p@hooks.example.com/x"}, "url", "no user or password"),
        ({"url": "https://hooks.example.com/x#top"}, "url", "no fragment"),
        ({"url": "hooks.example.com"}, "url", "no host"),
        ({"url": "https://hooks.example.com/\x00"}, "url", "String should match"),
        ({"url": URL, "event_types": ["order shipped"]}, "event_types.0", "String should match"),
        ({"url": URL, "event_types": ["a"] * 101}, "event_types", "at most 100"),
        ({"url": URL, "secret": "whsec_mine"}, "secret", "Extra inputs"),
        ({}, "url", "Field required"),
    ],
)
async def test_an_endpoint_the_rules_refuse_is_400_naming_its_field_and_stores_nothing(
    acme: httpx.AsyncClient, db: DbConnection, body: dict[str, Any], field: str, words: str
) -> None:
    answer = await acme.post("/v1/webhook-endpoints", json=body)
    assert answer.status_code == 400, answer.text
    [detail, *_] = answer.json()["details"]
    assert detail["field"] == field and words in detail["message"], answer.json()
    assert await db.fetchval("SELECT count(*) FROM webhook_endpoints") == 0


async def test_malformed_and_large_bodies_are_refused_with_details_and_store_nothing(
    acme: httpx.AsyncClient, db: DbConnection
) -> None:
    headers = {"Content-Type": "application/json"}
    answers = [
        await acme.post("/v1/webhook-endpoints", content=b"{", headers=headers),
        await acme.post("/v1/webhook-endpoints", content=b"[]", headers=headers),
        await acme.post("/v1/webhook-endpoints", content=b'{"url":"a","url":"b"}', headers=headers),
        await acme.post("/v1/webhook-endpoints", content=b"x", headers={"Content-Type": "text/x"}),
    ]
    assert [a.status_code for a in answers] == [400] * 4
    assert all(a.json()["details"] for a in answers)
    large = {"url": URL, "event_types": ["a" * 200] * (MAX_BODY_BYTES // 200)}
    too_large = await acme.post("/v1/webhook-endpoints", json=large)
    assert too_large.status_code == 413
    assert too_large.json() == {"error": "body_too_large", "max_bytes": MAX_BODY_BYTES}
    no_key = await acme.post(
        "/v1/webhook-endpoints", json={"url": URL}, headers={"Authorization": ""}
    )
    assert no_key.status_code == 401
    assert await db.fetchval("SELECT count(*) FROM webhook_endpoints") == 0


async def test_without_the_secrets_key_add_and_rotate_are_503_and_the_rest_is_served(
    db: DbConnection, settings: Settings, schema: str
) -> None:
    ingress = IngressSettings(queue="t.push", webhook_queue="t.hooks")
    async with (
        serve_in_process(db, settings.database, ingress) as served,
        client(served, served.key) as http,
    ):
        made = await http.post("/v1/webhook-endpoints", json={"url": URL})
        listed = await http.get("/v1/webhook-endpoints")
        rotate = await http.post("/v1/webhook-endpoints/ep_0123/rotate")
        push = await http.post(
            "/v1/messages",
            json={"targets": [{"platform": "ios", "token": "t"}]},
            headers={"Idempotency-Key": "k"},
        )
    for refused in (made, rotate):
        assert refused.status_code == 503
        assert refused.json()["error"] == "webhook_secrets_key_missing"
        assert "IW_WEBHOOK_SECRETS_KEY" in refused.json()["message"]
    assert (listed.status_code, listed.json()) == (200, {"endpoints": []})
    assert push.status_code == 202


async def test_no_secret_reaches_the_log_of_serve(
    db: DbConnection, schema: str, tmp_path: Path
) -> None:
    """A real `serve` at debug level: add, list, rotate, a refused add and a delete; its whole
    log holds neither a secret, nor the key that encrypts them, nor a URL's token."""
    env = {
        **os.environ,
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": schema,
        "PYTHONPATH": str(ROOT),
        "IW_WEBHOOK_SECRETS_KEY": KEY,
        "IW_INGRESS_WEBHOOK_QUEUE": "t.hooks",
    }
    api_key = cli(env, "api-key", "create", "--tenant", "acme").stdout.strip()
    log_path = tmp_path / "serve.log"
    url = f"{URL}?token=tok-7f3a9c"
    async with started(env, log_path, "consumers", "--log-level", "debug", "serve") as served:
        made = await asyncio.to_thread(
            subprocess.run,
            [
                "curl", "-sS", "-H", f"Authorization: Bearer {api_key}",
                "-H", "Content-Type: application/json",
                "--data-binary", json.dumps({"url": url}),
                f"{served}/v1/webhook-endpoints",
            ],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        endpoint = json.loads(made.stdout)
        async with httpx.AsyncClient(
            base_url=served, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
        ) as http:
            rotated = (await http.post(f"/v1/webhook-endpoints/{endpoint['id']}/rotate")).json()
            await http.get("/v1/webhook-endpoints")
            await http.post("/v1/webhook-endpoints", json={"url": "http://x.example/", "k": KEY})
            await http.delete(f"/v1/webhook-endpoints/{endpoint['id']}")
    text = log_path.read_text()
    assert "webhook_endpoint_added" in text and "webhook_secret_rotated" in text, text
    for leak in (endpoint["secret"], rotated["secret"], KEY, "tok-7f3a9c"):
        assert leak not in text, f"serve logged {leak!r}:\n{text}"
    for secret in (endpoint["secret"], rotated["secret"]):
        assert secret[6:20] not in text  # nor a piece past the prefix


def test_serve_with_a_key_that_is_no_fernet_key_refuses_to_start_saying_why(
    schema: str,
) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": schema,
        "IW_WEBHOOK_SECRETS_KEY": "not-a-key-5f1e",
    }
    done = subprocess.run(
        [sys.executable, "-m", "consumers", "serve", "--port", "0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 78, done.stdout + done.stderr
    assert "is not a Fernet key" in done.stdout + done.stderr
    assert "not-a-key-5f1e" not in done.stdout + done.stderr


async def test_a_method_a_path_does_not_take_is_405_naming_every_method_it_does(
    acme: httpx.AsyncClient,
) -> None:
    """One path, a route per method: the Allow header names them all (Starlette's names the
    first route's only)."""
    collection = await acme.put("/v1/webhook-endpoints")
    one = await acme.post("/v1/webhook-endpoints/ep_0123")
    assert (collection.status_code, collection.headers["allow"]) == (405, "GET, HEAD, POST")
    assert (one.status_code, one.headers["allow"]) == (405, "DELETE, GET, HEAD")
