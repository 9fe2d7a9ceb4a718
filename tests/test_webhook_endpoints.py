"""Webhook endpoints and their secrets in PostgreSQL, the worker's reads of them, and the
webhook job format (consumers.jobs.webhook, consumers.jobs.webhook_endpoints)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta

import asyncpg
import pytest
from cryptography.fernet import Fernet

from consumers import (
    InvalidWebhookJob,
    Settings,
    WebhookSettings,
    parse_webhook_job,
    webhook_job_body,
)
from consumers.jobs.webhook_endpoints import SigningReads, secret_box, url_problem
from dedupe import DbConnection, SecretBox, SigningEndpoint, WebhookEndpoints
from providers import TransientProviderError
from tests.conftest import DATABASE_URL
from tests.webhook_support import KEY


class CountingEndpoints(WebhookEndpoints):
    """The store, counting its `signing` reads."""

    reads = 0

    async def signing(
        self, conn: DbConnection, endpoint_id: str, box: SecretBox
    ) -> SigningEndpoint | None:
        self.reads += 1
        return await super().signing(conn, endpoint_id, box)


async def test_rotation_signs_with_both_until_the_old_expires(
    db: DbConnection, schema: str
) -> None:
    store, box = WebhookEndpoints(schema), secret_box((KEY,))
    endpoint, first = await store.add(
        db, tenant="acme", url="https://a.example/", event_types=["b.c", "a"], box=box
    )
    assert endpoint.id.startswith("ep_") and endpoint.event_types == ("a", "b.c")
    assert [s.prefix for s in endpoint.secrets] == [first[:10]]
    second = await store.rotate(db, endpoint.id, overlap=timedelta(hours=1), box=box)
    signing = await store.signing(db, endpoint.id, box)
    assert signing is not None and signing.secrets == (second, first)  # newest first
    assert first not in repr(signing) and str(second) not in repr(signing)
    third = await store.rotate(db, endpoint.id, overlap=timedelta(0), box=box)
    signing = await store.signing(db, endpoint.id, box)
    assert signing is not None and signing.secrets == (third,)
    [listed] = await store.endpoints(db, tenant="acme")
    assert [s.prefix for s in listed.secrets] == [str(third)[:10]]
    assert await store.rotate(db, "ep_none", overlap=timedelta(0), box=box) is None


async def test_disable_enable_remove_and_subscriptions(db: DbConnection, schema: str) -> None:
    store, box = WebhookEndpoints(schema), secret_box((KEY,))
    a, _ = await store.add(db, tenant="acme", url="https://a.example/", event_types=[], box=box)
    b, _ = await store.add(db, tenant="acme", url="https://b.example/", event_types=["x"], box=box)
    await store.add(db, tenant="globex", url="https://c.example/", event_types=[], box=box)
    assert await store.disable(db, a.id, reason="by hand")
    assert not await store.disable(db, a.id, reason="again")  # the first reason stays
    found = await store.subscriptions(db, ["acme"])
    assert [(s.id, s.takes("x"), s.takes("y")) for s in found] == [(b.id, True, False)]
    signing = await store.signing(db, a.id, box)
    assert signing is not None and signing.disabled_reason == "by hand"
    assert await store.enable(db, a.id) and not await store.enable(db, a.id)
    assert [s.id for s in await store.subscriptions(db, ["acme", "acme"])] == [a.id, b.id]
    assert await store.remove(db, a.id) and not await store.remove(db, a.id)
    assert await store.signing(db, a.id, box) is None
    assert await db.fetchval("SELECT count(*) FROM webhook_secrets") == 2


async def test_a_burst_reads_an_endpoint_once_and_a_lost_key_is_transient(
    db: DbConnection, schema: str
) -> None:
    store, box = CountingEndpoints(schema), secret_box((KEY,))
    endpoint, secret = await store.add(
        db, tenant="acme", url="https://a.example/", event_types=[], box=box
    )
    pool = await asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=2)
    try:
        reads = SigningReads(pool, store, box, cache_seconds=60)
        got = await asyncio.gather(*(reads.read(endpoint.id) for _ in range(20)))
        assert store.reads == 1 and {g.secrets if g else () for g in got} == {(secret,)}
        reads.forget(endpoint.id)
        await reads.read(endpoint.id)
        assert store.reads == 2
        other = secret_box((Fernet.generate_key().decode(),))  # the key it was made with is gone
        lost = SigningReads(pool, store, other, cache_seconds=60)
        with pytest.raises(TransientProviderError, match="secret_undecryptable"):
            await lost.read(endpoint.id)
        with pytest.raises(TransientProviderError):  # a failed read is not kept
            await lost.read(endpoint.id)
        assert store.reads == 4
        rotated = secret_box((Fernet.generate_key().decode(), KEY))  # a new key first: both read
        assert await SigningReads(pool, store, rotated, cache_seconds=0).read(endpoint.id)
    finally:
        await pool.close()


def test_the_webhook_settings_are_read_from_the_environment_and_keep_the_key_out_of_repr() -> None:
    settings = Settings.from_env(
        {
            "IW_WEBHOOK_SECRETS_KEY": f" {KEY} ,second-key,",
            "IW_WEBHOOK_ALLOW_HTTP_HOSTS": "LocalHost, 127.0.0.1",
            "IW_WEBHOOK_ROTATION_OVERLAP_HOURS": "2.5",
        }
    )
    webhooks = settings.webhooks
    assert webhooks.secrets_keys == (KEY, "second-key")
    assert webhooks.allow_http_hosts == {"localhost", "127.0.0.1"}
    assert webhooks.rotation_overlap_hours == 2.5
    assert KEY not in repr(settings) and "second-key" not in repr(settings)
    assert Settings.from_env({}).webhooks == WebhookSettings()


def test_the_secrets_key_is_refused_without_being_quoted() -> None:
    with pytest.raises(Exception, match="not set"):
        secret_box(())
    with pytest.raises(Exception, match="key 2 of 2 is not a Fernet key") as bad:
        secret_box((KEY, "hunter2-not-a-key"))
    assert "hunter2" not in str(bad.value)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://hooks.example/in", None),
        ("http://127.0.0.1:8080/in", None),
        ("http://hooks.example/in", "https only: http to hooks.example"),
        ("ftp://hooks.example/in", "https only"),
        ("https://user:pw@hooks.example/", "no user or password"),
        ("https://hooks.example/#x", "no fragment"),
        ("https:///in", "no host"),
        ("https://hooks.example:99999/", "not a URL"),
    ],
)
def test_an_endpoint_url_is_https_or_allowed_http(url: str, problem: str | None) -> None:
    found = url_problem(url, frozenset({"127.0.0.1"}))
    assert found == problem if problem is None else (found or "").startswith(problem)


def test_a_job_sends_the_same_standard_webhooks_payload_every_time() -> None:
    body = webhook_job_body(
        event_type="order.shipped",
        payload={"b": [1, 2.5, "é"], "a": None},
        timestamp="2026-03-01T12:00:00Z",
    )
    first = parse_webhook_job(json.loads(json.dumps(body)))
    again = parse_webhook_job(json.loads(json.dumps(body)))
    assert first.body == again.body
    assert (
        first.body
        == (
            '{"type":"order.shipped","timestamp":"2026-03-01T12:00:00Z","data":{"b":[1,2.5,"é"],"a":null}}'
        ).encode()
    )
    assert json.loads(parse_webhook_job({"event_type": "a", "payload": 1}).body) == {
        "type": "a",
        "data": 1,
    }
    assert webhook_job_body(event_type="a", payload={})["timestamp"].endswith("Z")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"payload": {}}, "event_type"),
        ({"event_type": "order shipped", "payload": {}}, "event_type"),
        ({"event_type": "a.", "payload": {}}, "event_type"),
        ({"event_type": "a"}, "payload"),
        ({"event_type": "a", "payload": {}, "timestamp": "yesterday"}, "timestamp"),
        ({"event_type": "a", "payload": {}, "timestamp": 5}, "timestamp"),
        ({"event_type": "a", "payload": {}, "endpoints": []}, "endpoints"),
        ({"event_type": "a", "payload": {}, "endpoints": ["nope"]}, "endpoints[0]"),
        ({"event_type": "a", "payload": {}, "endpoints": ["ep_a"] * 101}, "endpoints"),
        ({"event_type": "a", "payload": float("nan")}, "payload"),
        ({"event_type": "a", "payload": "\ud800"}, "payload"),
    ],
)
def test_a_job_that_is_not_one_says_which_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidWebhookJob, match="^" + re.escape(field)):
        parse_webhook_job(body)
