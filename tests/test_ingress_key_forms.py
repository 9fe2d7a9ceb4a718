"""The Idempotency-Key header as the world writes it: UTF-8, plain or an RFC 8941 sf-string.

The body's key and the header's are compared after decoding, so one intent
is one message whichever place and form a client uses; a header that is not
UTF-8 is refused, never read as Latin-1.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from consumers import Settings, push_job_body
from dedupe import DbConnection
from ingress.settings import IngressSettings
from providers import Platform, Target
from tests.ingress_support import Served, serve_in_process

JOB = push_job_body(targets=[Target(platform=Platform.IOS, token="ios-token-1")], title="hi")
ACCENTED = "clé-order-1042-ü"
WIDEST = "é" * 64  # 128 bytes of UTF-8: the longest key there is


@pytest.fixture
async def served(db: DbConnection, settings: Settings) -> AsyncIterator[Served]:
    async with serve_in_process(db, settings.database, IngressSettings(queue="t.keys")) as s:
        yield s


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
    ) as client:
        yield client


def sf_string(key: str) -> bytes:
    """`key` as an RFC 8941 sf-string: quoted, `"` and `\\` escaped, sent as UTF-8."""
    return ('"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"').encode()


async def send(http: httpx.AsyncClient, header: bytes | None, body_key: str | None) -> Any:
    body = JOB if body_key is None else {**JOB, "idempotency_key": body_key}
    headers = {} if header is None else {b"Idempotency-Key": header}
    return await http.post("/v1/messages", json=body, headers=headers)


async def stored_keys(db: DbConnection) -> list[str]:
    rows = await db.fetch("SELECT idempotency_key FROM ingress_idempotency_keys ORDER BY 1")
    return [r[0] for r in rows]


@pytest.mark.parametrize(
    "key", [ACCENTED, WIDEST, 'say "hi" \\ bye'], ids=["accents", "128B", "escapes"]
)
async def test_one_key_in_the_body_the_plain_header_and_the_sf_string_is_one_message(
    http: httpx.AsyncClient, db: DbConnection, key: str
) -> None:
    first = await send(http, None, key)
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "queued"
    forms = [sf_string(key)] + ([] if '"' in key[:1] else [key.encode()])
    for header in forms:
        again = await send(http, header, None)
        both = await send(http, header, key)
        assert (again.status_code, again.json()) == (
            202,
            {"status": "duplicate_ignored", "id": first.json()["id"]},
        ), header
        assert both.json() == again.json(), header
    assert await stored_keys(db) == [key]  # stored as the client meant it, not as Latin-1


async def test_the_first_use_in_the_header_stores_the_decoded_key(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    plain = await send(http, ACCENTED.encode(), None)
    quoted = await send(http, sf_string(WIDEST), None)
    assert plain.status_code == quoted.status_code == 202
    assert plain.json()["status"] == quoted.json()["status"] == "queued"
    assert sorted(await stored_keys(db)) == sorted([ACCENTED, WIDEST])


@pytest.mark.parametrize(
    ("header", "body_key"),
    [
        (b"cl\xe9-1042", None),  # Latin-1's e-acute: not UTF-8
        (b"\xff", "\u00ff"),  # read as Latin-1 it would match the body's y-umlaut
        (b'"\xe9"', None),  # not UTF-8 inside the quotes either
        (b'"unterminated', None),
        (b'"bad \\n escape"', None),  # RFC 8941 knows only \" and \\
        (b'"two" "strings"', None),
        (b'""', None),  # an empty key
    ],
    ids=["latin1", "latin1-matching-body", "latin1-quoted", "open-quote", "escape", "two", "empty"],
)
async def test_a_header_that_names_no_key_is_400_and_stores_nothing(
    http: httpx.AsyncClient, db: DbConnection, header: bytes, body_key: str | None
) -> None:
    answer = await send(http, header, body_key)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_request"
    assert answer.json()["details"][0]["field"] == "Idempotency-Key"
    assert await stored_keys(db) == []


async def test_a_key_of_129_bytes_is_400_in_either_form(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    for header in ((WIDEST + "x").encode(), sf_string(WIDEST + "x")):
        answer = await send(http, header, None)
        assert answer.status_code == 400, header
    assert await stored_keys(db) == []
