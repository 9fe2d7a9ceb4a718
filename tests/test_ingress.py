"""The send API over real HTTP: 202 queued / duplicate_ignored, 422, 400, 401, 404, 409."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers import Settings, parse_push_job, push_job_body
from dedupe import DbConnection, Messages, Retention, cleanup, job_message_id
from dedupe.fingerprint import is_plain
from ingress.body import decode_body, validated
from ingress.refusals import Refusal
from ingress.settings import IngressSettings
from providers import Platform, Target
from tests.ingress_support import Served, serve_in_process
from tests.support import end_generation_0

IOS = Target(platform=Platform.IOS, token="ios-token-aaaaaaaaaaaa")
ANDROID = Target(platform=Platform.ANDROID, token="android-token-cccccccc")


def job(*targets: Target, title: str = "Shipped") -> dict[str, Any]:
    return push_job_body(targets=list(targets) or [IOS], title=title, data={"order": "1042"})


@pytest.fixture
async def served(db: DbConnection, settings: Settings) -> AsyncIterator[Served]:
    ingress = IngressSettings(queue="test.ingress.push")
    async with serve_in_process(db, settings.database, ingress) as s:
        yield s


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=served.url,
        headers={"Authorization": f"Bearer {served.key}"},
        timeout=30,
        limits=httpx.Limits(max_connections=30),
    ) as client:
        yield client


async def counts(db: DbConnection) -> tuple[int, int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM ingress_idempotency_keys),"
        " (SELECT count(*) FROM ingress_messages), (SELECT count(*) FROM outbox)"
    )
    assert row is not None
    return (row[0], row[1], row[2])


async def test_first_request_is_queued_with_key_message_and_outbox_rows(
    http: httpx.AsyncClient, db: DbConnection, served: Served
) -> None:
    answer = await http.post("/v1/messages", json={**job(IOS, ANDROID), "idempotency_key": "k-1"})
    assert answer.status_code == 202
    assert answer.json()["status"] == "queued"
    assert "idempotent-replayed" not in answer.headers
    message_id = answer.json()["id"]
    assert await counts(db) == (1, 1, 1)
    row = await db.fetchrow("SELECT queue, tenant, message_id, headers, body FROM outbox")
    assert row is not None
    assert row["queue"] == served.queue
    assert row["tenant"] == "acme"
    assert row["message_id"] == f"ingress-{message_id}"
    assert json.loads(row["headers"]) == {"x-ingress-message": message_id}
    assert json.loads(row["body"]) == job(IOS, ANDROID)  # the job, the key left out


async def test_same_request_twice_is_one_message_and_the_replay_says_so(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    body = {**job(), "idempotency_key": "k-twice"}
    first = await http.post("/v1/messages", json=body)
    again = await http.post("/v1/messages", json=body)
    assert first.status_code == again.status_code == 202
    assert again.json() == {"status": "duplicate_ignored", "id": first.json()["id"]}
    assert again.headers["idempotent-replayed"] == "true"
    assert await counts(db) == (1, 1, 1)


async def test_twenty_identical_requests_at_once_make_one_message(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    body = {**job(IOS, ANDROID), "idempotency_key": "k-parallel"}
    answers = await asyncio.gather(*(http.post("/v1/messages", json=body) for _ in range(20)))
    assert [a.status_code for a in answers] == [202] * 20
    statuses = sorted(a.json()["status"] for a in answers)
    assert statuses == ["duplicate_ignored"] * 19 + ["queued"]
    assert len({a.json()["id"] for a in answers}) == 1
    assert await counts(db) == (1, 1, 1)


async def test_twenty_identical_requests_on_two_servers_make_one_message(
    db: DbConnection, settings: Settings, served: Served
) -> None:
    """Two processes' worth of committers: the unique index decides, not process memory."""
    ingress = IngressSettings(queue=served.queue, lanes=1, max_batch=1)
    async with serve_in_process(db, settings.database, ingress) as second:
        body = {**job(), "idempotency_key": "k-two-servers"}
        clients = [
            httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {served.key}"})
            for url in (served.url, second.url)
        ]
        try:
            answers = await asyncio.gather(
                *(clients[n % 2].post("/v1/messages", json=body, timeout=30) for n in range(20))
            )
        finally:
            for client in clients:
                await client.aclose()
    assert sorted(a.json()["status"] for a in answers) == ["duplicate_ignored"] * 19 + ["queued"]
    assert len({a.json()["id"] for a in answers}) == 1
    assert await counts(db) == (1, 1, 1)


async def test_canonical_equal_body_is_a_duplicate(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    body = {**job(), "idempotency_key": "k-canon"}
    first = await http.post("/v1/messages", json=body)
    reordered = json.dumps(dict(reversed(list(body.items()))), indent=2)
    again = await http.post(
        "/v1/messages", content=reordered, headers={"content-type": "application/json"}
    )
    assert again.json() == {"status": "duplicate_ignored", "id": first.json()["id"]}


async def test_same_key_with_another_body_is_422_and_stores_nothing(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    await http.post("/v1/messages", json={**job(), "idempotency_key": "k-reused"})
    reused = await http.post(
        "/v1/messages", json={**job(title="Another"), "idempotency_key": "k-reused"}
    )
    assert reused.status_code == 422
    assert reused.json() == {"error": "idempotency_key_reused"}
    assert await counts(db) == (1, 1, 1)


async def test_key_in_the_header_is_the_same_key_as_in_the_body(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    first = await http.post("/v1/messages", json=job(), headers={"Idempotency-Key": "k-h"})
    again = await http.post("/v1/messages", json={**job(), "idempotency_key": "k-h"})
    both = await http.post(
        "/v1/messages", json={**job(), "idempotency_key": "k-h"}, headers={"Idempotency-Key": "k-h"}
    )
    assert first.json()["status"] == "queued"
    assert again.json() == both.json() == {"status": "duplicate_ignored", "id": first.json()["id"]}


async def test_two_different_keys_in_body_and_header_is_400(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    answer = await http.post(
        "/v1/messages", json={**job(), "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_request"
    assert answer.json()["details"][0]["field"] == "idempotency_key"
    assert await counts(db) == (0, 0, 0)


async def test_no_key_is_400_key_required(http: httpx.AsyncClient, db: DbConnection) -> None:
    answer = await http.post("/v1/messages", json=job())
    assert answer.status_code == 400
    assert answer.json() == {"error": "idempotency_key_required"}
    assert await counts(db) == (0, 0, 0)


@pytest.mark.parametrize(
    "key", ["", "x" * 129, "é" * 65], ids=["empty", "129-bytes", "130-bytes-in-65-chars"]
)
async def test_key_outside_1_to_128_bytes_is_400(
    http: httpx.AsyncClient, db: DbConnection, key: str
) -> None:
    answer = await http.post("/v1/messages", json={**job(), "idempotency_key": key})
    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_request"
    assert await counts(db) == (0, 0, 0)


async def test_key_holding_a_nul_character_is_400_not_503(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    """PostgreSQL's text cannot store U+0000: said at once, not retried as unavailable."""
    answer = await http.post("/v1/messages", json={**job(), "idempotency_key": "k-\u0000"})
    assert answer.status_code == 400
    assert answer.json()["details"][0]["field"] == "idempotency_key"
    assert await counts(db) == (0, 0, 0)


async def test_key_of_128_bytes_is_accepted(http: httpx.AsyncClient) -> None:
    answer = await http.post("/v1/messages", json={**job(), "idempotency_key": "é" * 64})
    assert answer.status_code == 202


async def test_invalid_body_is_400_then_the_fixed_body_with_the_same_key_is_queued(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    broken = {**job(), "targets": [{"platform": "blackberry", "token": ""}], "idempotency_key": "k"}
    refused = await http.post("/v1/messages", json=broken)
    assert refused.status_code == 400
    assert refused.json()["error"] == "invalid_request"
    fields = {d["field"] for d in refused.json()["details"]}
    assert fields == {"targets.0.platform", "targets.0.token"}
    assert await counts(db) == (0, 0, 0)
    fixed = await http.post("/v1/messages", json={**job(), "idempotency_key": "k"})
    assert fixed.status_code == 202
    assert fixed.json()["status"] == "queued"


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[1, 2]",
        b'{"targets": [{"platform": "ios", "token": "t"}], "ttl_seconds": "3600"}',
        b'{"targets": [{"platform": "ios", "token": "t"}], "priority": "urgent"}',
        b'{"targets": [{"platform": "ios", "token": "t"}], "surprise": 1}',
        b'{"targets": [{"platform": "ios", "token": "t"}], "notification": {"data": {"a": 1}}}',
    ],
    ids=["not-json", "not-an-object", "string-ttl", "bad-priority", "unknown-field", "data-int"],
)
async def test_bodies_the_worker_would_refuse_are_400_invalid_request(
    http: httpx.AsyncClient, db: DbConnection, body: bytes
) -> None:
    answer = await http.post(
        "/v1/messages",
        content=body,
        headers={"content-type": "application/json", "Idempotency-Key": "k"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == "invalid_request"
    assert answer.json()["details"]
    assert await counts(db) == (0, 0, 0)


async def test_no_key_or_an_unknown_key_is_401(served: Served, db: DbConnection) -> None:
    async with httpx.AsyncClient(base_url=served.url) as anonymous:
        none = await anonymous.post("/v1/messages", json={**job(), "idempotency_key": "k"})
        made_up = await anonymous.post(
            "/v1/messages",
            json={**job(), "idempotency_key": "k"},
            headers={"Authorization": "Bearer iwk_made-up"},
        )
        read = await anonymous.get("/v1/messages/00000000-0000-0000-0000-000000000000")
    for answer in (none, made_up, read):
        assert answer.status_code == 401
        assert answer.json() == {"error": "unauthorized"}
    assert await counts(db) == (0, 0, 0)


async def test_keys_are_scoped_per_tenant(
    http: httpx.AsyncClient, served: Served, db: DbConnection
) -> None:
    body = {**job(), "idempotency_key": "welcome-1"}
    acme = await http.post("/v1/messages", json=body)
    globex = await http.post(
        "/v1/messages", json=body, headers={"Authorization": f"Bearer {served.other_key}"}
    )
    assert acme.json()["status"] == globex.json()["status"] == "queued"
    assert acme.json()["id"] != globex.json()["id"]
    other_tenant_reads = await http.get(
        f"/v1/messages/{globex.json()['id']}",
        headers={"Authorization": f"Bearer {served.key}"},
    )
    assert other_tenant_reads.status_code == 404
    cancel_other = await http.post(f"/v1/messages/{globex.json()['id']}/cancel")
    assert cancel_other.status_code == 404
    assert await counts(db) == (2, 2, 2)


async def test_read_shows_the_status_and_each_targets_ledger_state(
    http: httpx.AsyncClient, db: DbConnection, served: Served
) -> None:
    sent = await http.post("/v1/messages", json={**job(IOS, ANDROID), "idempotency_key": "k"})
    message_id = sent.json()["id"]
    before = await http.get(f"/v1/messages/{message_id}")
    assert before.status_code == 200
    assert before.json()["status"] == "queued"
    assert [t["status"] for t in before.json()["targets"]] == ["pending", "pending"]
    # What the push worker writes for this job, under the dedupe key it uses.
    await db.execute(
        "INSERT INTO send_ledger (consumer, tenant, message_id, target_index, channel, address,"
        " effect_id, collapse_id, status, provider_message_id, failure_reason) VALUES"
        " ($1, 'acme', $2, 0, 'ios', 't', gen_random_uuid(), 'c', 'sent', 'apns-1', NULL),"
        " ($1, 'acme', $2, 1, 'android', 't', gen_random_uuid(), 'c', 'failed', NULL, 'gone')",
        served.queue,
        job_message_id(uuid.UUID(message_id)),
    )
    after = (await http.get(f"/v1/messages/{message_id}")).json()
    assert [
        (t["status"], t["provider_message_id"], t["failure_reason"]) for t in after["targets"]
    ] == [
        ("sent", "apns-1", None),
        ("failed", None, "gone"),
    ]
    assert (await http.get("/v1/messages/not-an-id")).status_code == 404
    missing = await http.get("/v1/messages/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404
    assert missing.json() == {"error": "not_found"}


async def test_cancel_is_200_then_200_again_and_409_once_taken(
    http: httpx.AsyncClient, db: DbConnection, settings: Settings
) -> None:
    first = (await http.post("/v1/messages", json={**job(), "idempotency_key": "a"})).json()["id"]
    cancelled = await http.post(f"/v1/messages/{first}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json() == {"id": first, "status": "cancelled"}
    again = await http.post(f"/v1/messages/{first}/cancel")
    assert again.status_code == 200
    assert again.json() == cancelled.json()
    assert (await http.get(f"/v1/messages/{first}")).json()["status"] == "cancelled"

    second = (await http.post("/v1/messages", json={**job(), "idempotency_key": "b"})).json()["id"]
    async with db.transaction():  # what the push worker's claim transaction does
        assert await Messages(settings.database.schema).take(db, [uuid.UUID(second)]) == set()
    too_late = await http.post(f"/v1/messages/{second}/cancel")
    assert too_late.status_code == 409
    assert too_late.json() == {"error": "message_not_cancellable", "status": "taken"}
    assert (await http.post("/v1/messages/nope/cancel")).status_code == 404


async def test_keys_past_retention_are_forgotten_and_the_key_makes_a_new_message(
    http: httpx.AsyncClient, db: DbConnection, schema: str
) -> None:
    body = {**job(), "idempotency_key": "k-old"}
    first = (await http.post("/v1/messages", json=body)).json()["id"]
    # k-old's generations (its key's, its message's) end, k-young's are the next: as if
    # 8 days apart.
    await end_generation_0(db, schema)
    kept = (await http.post("/v1/messages", json={**job(), "idempotency_key": "k-young"})).json()
    await http.post(f"/v1/messages/{first}/cancel")  # not queued any more: may go too
    await db.execute("ANALYZE ingress_idempotency_keys_g0; ANALYZE ingress_messages_g0")
    result = await cleanup(db, schema, Retention(keep=timedelta(days=7)))
    assert (result.ingress_keys, result.ingress_messages) == (1, 1)
    again = await http.post("/v1/messages", json=body)
    assert again.json()["status"] == "queued" and again.json()["id"] != first
    replay = await http.post("/v1/messages", json={**job(), "idempotency_key": "k-young"})
    assert replay.json() == {"status": "duplicate_ignored", "id": kept["id"]}


async def test_database_refusing_the_commit_is_503_with_retry_after_and_stores_nothing(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    body = {**job(), "idempotency_key": "k-503"}
    await db.execute("ALTER TABLE ingress_messages RENAME TO ingress_messages_away")
    try:
        refused = await http.post("/v1/messages", json=body)
    finally:
        await db.execute("ALTER TABLE ingress_messages_away RENAME TO ingress_messages")
    assert refused.status_code == 503
    assert refused.json() == {"error": "unavailable"}
    assert refused.headers["retry-after"] == "1"
    assert await counts(db) == (0, 0, 0)  # the key row went with the failed transaction
    retried = await http.post("/v1/messages", json=body)
    assert retried.status_code == 202 and retried.json()["status"] == "queued"


def _job_bodies(odd: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Push job bodies: every field valid, or (`odd`) any field possibly not."""

    def field(valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]) -> Any:
        return st.one_of(valid, invalid) if odd else valid

    text = st.text(max_size=3)
    bad_text = st.one_of(st.none(), st.integers(-1, 1), st.just(""))
    return st.fixed_dictionaries(
        {
            "targets": st.lists(
                st.fixed_dictionaries(
                    {
                        "platform": field(
                            st.sampled_from(["ios", "android", "web"]), st.just("fax")
                        ),
                        "token": field(st.sampled_from(["t1", "t2", "t\u00e9"]), bad_text),
                    }
                ),
                min_size=1,
                max_size=4,
            ),
        },
        optional={
            "notification": field(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "title": field(st.one_of(st.none(), text), bad_text),
                        "body": field(st.one_of(st.none(), text), bad_text),
                        "data": st.dictionaries(text, field(text, bad_text), max_size=2),
                    },
                ),
                st.one_of(st.none(), st.just([])),
            ),
            "priority": field(
                st.sampled_from([None, "high", "normal"]), st.sampled_from(["low", 1])
            ),
            "ttl_seconds": field(
                st.one_of(st.none(), st.integers(0, 2**31 - 1)),
                st.one_of(st.integers(-2, -1), st.just(2**40), st.floats(0, 10), st.text()),
            ),
            "push_type": field(st.one_of(st.none(), st.text(min_size=1, max_size=3)), bad_text),
            "collapse_key": field(st.one_of(st.none(), st.text(min_size=1, max_size=3)), bad_text),
        },
    )


_bodies = st.one_of(_job_bodies(odd=False), _job_bodies(odd=True))


@settings(max_examples=500, deadline=None)
@given(_bodies)
def test_a_body_the_send_api_takes_is_a_push_job_with_the_same_devices(
    body: dict[str, Any],
) -> None:
    """What the send route takes (`ingress.body`), the push worker takes, with the same devices."""
    try:
        accepted = validated(decode_body("application/json", json.dumps(body).encode()))
    except Refusal:
        return
    parsed = parse_push_job(body)  # the worker's parser raises nothing on it
    assert parsed.targets == accepted.job.targets
    assert is_plain(body)  # what the route's fingerprint(body, plain=True) assumes
