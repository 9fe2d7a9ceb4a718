"""Bodies a JSON parser may read two ways: decoded once, refused with 400, never a 500.

The send API validates and stores one decoded value; a body whose value
depends on the parser (a key given twice, a number past any float, a lone
surrogate, NaN) is refused, so what is validated is what is stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from consumers import Settings
from consumers.jobs.push import MAX_AUDIENCE
from dedupe import DbConnection
from ingress.body import MAX_DETAILS, MAX_JSON_VALUES
from ingress.settings import IngressSettings
from tests.ingress_support import Served, serve_in_process

TARGETS = '"targets":[{"platform":"ios","token":"ios-token-1"}]'


@pytest.fixture
async def served(db: DbConnection, settings: Settings) -> AsyncIterator[Served]:
    async with serve_in_process(db, settings.database, IngressSettings(queue="t.bodies")) as s:
        yield s


async def post_raw(served: Served, body: str, key: str) -> httpx.Response:
    """`body` as the bytes of a JSON send, with the test tenant's key and `key`."""
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as http:
        return await http.post(
            "/v1/messages",
            content=body.encode(),
            headers={
                "Authorization": f"Bearer {served.key}",
                "Content-Type": "application/json",
                "Idempotency-Key": key,
            },
        )


@pytest.mark.parametrize(
    "body",
    [
        '{"ttl_seconds":1e999,"ttl_seconds":60,' + TARGETS + "}",
        '{"ttl_seconds":60,"ttl_seconds":1e999,' + TARGETS + "}",
        '{"ttl_seconds":60,"ttl_seconds":61,' + TARGETS + "}",
        "{" + TARGETS + "," + TARGETS + "}",
        '{"notification":{"title":"a","title":"b"},' + TARGETS + "}",
        '{"ttl_seconds":NaN,' + TARGETS + "}",
        '{"ttl_seconds":Infinity,' + TARGETS + "}",
        '{"notification":{"title":"\\ud800"},' + TARGETS + "}",
        '{"notification":{"data":{"\\udfff":"x"}},' + TARGETS + "}",
        '{"ttl_seconds":' + "9" * 5000 + "," + TARGETS + "}",
        '{"idempotency_key":"a","idempotency_key":"b",' + TARGETS + "}",
    ],
    ids=[
        "inf-then-60",
        "60-then-inf",
        "ttl-twice",
        "targets-twice",
        "nested-twice",
        "nan",
        "infinity",
        "lone-surrogate",
        "surrogate-key",
        "5000-digits",
        "key-twice",
    ],
)
async def test_a_body_read_two_ways_is_400_and_stores_nothing(
    served: Served, db: DbConnection, body: str
) -> None:
    answer = await post_raw(served, body, "k-1")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request"
    assert await db.fetchval("SELECT count(*) FROM ingress_idempotency_keys") == 0
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


def _job(**fields: object) -> dict[str, object]:
    return {"targets": [{"platform": "ios", "token": "ios-token-1"}], **fields}


@pytest.mark.parametrize(
    "body",
    [
        {"targets": [{"platform": "android", "token": "tok\x00en"}]},
        {"targets": [{"platform": "ios", "token": "a/../b"}]},
        {"targets": [{"platform": "ios", "token": "tok en"}]},
        _job(notification={"title": "a\x00b"}),
        _job(notification={"data": {"k\x00": "v"}}),
        _job(collapse_key="c\x00"),
        _job(push_type="alert\r\nx-injected: 1"),
        _job(ttl_seconds=2**31),
    ],
    ids=[
        "nul-token",
        "path-token",
        "space-token",
        "nul-title",
        "nul-data",
        "nul-collapse",
        "header-push-type",
        "ttl-past-range",
    ],
)
async def test_what_the_worker_refuses_the_door_refuses(
    served: Served, db: DbConnection, body: dict[str, object]
) -> None:
    """A 202 means the worker will attempt the job: what it would dead-letter is 400 here."""
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
        answer = await http.post(
            "/v1/messages",
            json={**body, "idempotency_key": "k-1"},
            headers={"Authorization": f"Bearer {served.key}"},
        )
    assert answer.status_code == 400, answer.text
    assert await db.fetchval("SELECT count(*) FROM outbox") == 0


@pytest.mark.parametrize(
    ("platform", "push_type", "pad", "status"),
    [
        ("ios", None, 5_000, 400),  # past 4,096: every device would fail PayloadTooLarge
        ("ios", "voip", 4_500, 202),  # VoIP takes 5,120
        ("ios", "voip", 6_000, 400),
        ("android", None, 5_000, 202),  # APNs' rule: no iOS device, no refusal
    ],
    ids=["ios-5000", "voip-4500", "voip-6000", "android-5000"],
)
async def test_a_payload_apns_would_refuse_is_refused_at_the_door(
    served: Served, db: DbConnection, platform: str, push_type: str | None, pad: int, status: int
) -> None:
    job: dict[str, object] = {
        "targets": [{"platform": platform, "token": "device-token-1"}],
        "notification": {"title": "Shipped", "data": {"pad": "x" * pad}},
        "idempotency_key": f"k-{platform}-{pad}",
    }
    if push_type is not None:
        job["push_type"] = push_type
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
        answer = await http.post(
            "/v1/messages", json=job, headers={"Authorization": f"Bearer {served.key}"}
        )
    assert answer.status_code == status, answer.text
    if status == 400:
        [detail] = answer.json()["details"]
        assert detail["field"] == "notification"
        assert "APNs takes at most" in detail["message"], detail
        assert await db.fetchval("SELECT count(*) FROM outbox") == 0


def _many(n: int, where: str) -> str:
    """A job whose one place `where` holds `n` problems of a few bytes each."""
    many = ",".join(f'"k{i}":0' for i in range(n))
    if where == "top":
        return "{" + TARGETS + "," + many + "}"
    if where == "target":
        return '{"targets":[{"platform":"ios","token":"t",' + many + "}]}"
    if where == "notification":
        return "{" + TARGETS + ',"notification":{' + many + "}}"
    if where == "data":
        return "{" + TARGETS + ',"notification":{"data":{' + many + "}}}"
    assert where == "targets"
    return '{"targets":[' + ",".join(["{}"] * n) + "]}"


@pytest.mark.parametrize("where", ["top", "target", "notification", "data", "targets"])
async def test_a_body_of_many_problems_gets_a_400_of_a_few(served: Served, where: str) -> None:
    """100,000 problems of a few bytes each (under 1.2 MB, far inside the request limit):
    the 400 lists MAX_DETAILS of them and says more went unlisted. Before, every one
    was found and listed, and a 5.9 MB body of unknown fields took serve from 67 to
    740 MB."""
    body = _many(100_000, where)
    answer = await post_raw(served, body, f"many-{where}")
    assert answer.status_code == 400, answer.text
    details = answer.json()["details"]
    assert len(answer.content) < 10_000
    if where == "targets":  # pydantic stops at the first wrong target: its two fields
        assert [d["field"] for d in details] == ["targets.0.platform", "targets.0.token"]
        return
    assert len(details) == MAX_DETAILS + 1, len(details)
    assert details[-1] == {
        "field": "body",
        "message": f"more problems than the {MAX_DETAILS} listed",
    }
    assert details[0]["field"].endswith("k0") and details[MAX_DETAILS - 1]["field"].endswith("k19")


async def test_a_body_of_millions_of_tiny_values_is_refused_before_it_is_decoded(
    served: Served,
) -> None:
    """5 million zeros in 10 MB, inside the request limit: as Python objects, hundreds
    of MB. Counted from the bytes, refused as more than any send holds."""
    body = "{" + TARGETS + ',"pad":[' + ",".join(["0"] * 5_000_000) + "]}"
    answer = await post_raw(served, body, "millions")
    assert answer.status_code == 400, answer.text
    assert answer.json()["details"] == [
        {"field": "body", "message": f"more JSON values than a send holds ({MAX_JSON_VALUES:,})"}
    ]


async def test_a_send_to_the_most_devices_a_send_holds_is_still_taken(
    served: Served, db: DbConnection
) -> None:
    """MAX_AUDIENCE devices, each in its own object, with notification data: under
    MAX_JSON_VALUES, queued as parts of 200."""
    targets = ",".join(
        f'{{"platform":"ios","token":"device:{n:06d}.x"}}' for n in range(MAX_AUDIENCE)
    )
    body = '{"targets":[' + targets + '],"notification":{"title":"a,b","data":{"k":"[,{"}}}'
    answer = await post_raw(served, body, "everyone")
    assert answer.status_code == 202, answer.text
    assert await db.fetchval("SELECT count(*) FROM outbox") == MAX_AUDIENCE // 200
