"""POST /v1/emails over real HTTP: the idempotency-key contract of POST /v1/messages, the
e-mail worker's own rules at the door, and one e-mail through serve, the relay and a worker
to a real SMTP server (aiosmtpd), once per recipient.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consumers import InvalidEmailJob, Settings, parse_email_job
from dedupe import DbConnection
from ingress.body import decode_body
from ingress.emails import email_job
from ingress.refusals import Refusal
from ingress.settings import IngressSettings
from providers.fakes.smtp import FakeSmtp
from tests.harness import Harness
from tests.ingress_support import Served, serve_in_process
from tests.support import wait_for
from tests.test_email import email_app
from tests.test_ingress_push import relaying

pytestmark = pytest.mark.timeout(120)

EMAIL: dict[str, Any] = {
    "to": ["ada@example.com", "bob@Example.COM", "ada@EXAMPLE.com"],  # ada twice: one e-mail
    "subject": "Your order shipped",
    "text": "On its way",
}
PUSH: dict[str, Any] = {"targets": [{"platform": "ios", "token": "ios-token-1"}]}


async def counts(db: DbConnection) -> tuple[int, int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM ingress_idempotency_keys),"
        " (SELECT count(*) FROM ingress_messages), (SELECT count(*) FROM outbox)"
    )
    assert row is not None
    return row[0], row[1], row[2]


def client(served: Served) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=served.url, headers={"Authorization": f"Bearer {served.key}"}, timeout=30
    )


@pytest.fixture
async def http(db: DbConnection, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    ingress = IngressSettings(queue="t.push", email_queue="t.emails")
    async with serve_in_process(db, settings.database, ingress) as served, client(served) as c:
        yield c


async def test_an_email_is_queued_and_its_replay_answers_the_first_id(
    http: httpx.AsyncClient, db: DbConnection
) -> None:
    first = await http.post("/v1/emails", json=EMAIL, headers={"Idempotency-Key": "mail-1"})
    assert first.status_code == 202, first.text
    message = first.json()["id"]
    row = await db.fetchrow("SELECT queue, message_id, body FROM outbox")
    assert row is not None
    assert (row["queue"], row["message_id"]) == ("t.emails", f"ingress-{message}")
    assert json.loads(row["body"]) == EMAIL  # the job as the worker reads it, the key left out
    again = await http.post("/v1/emails", json={**EMAIL, "idempotency_key": "mail-1"})
    assert again.json() == {"status": "duplicate_ignored", "id": message}
    assert again.headers["idempotent-replayed"] == "true"
    other = await http.post(
        "/v1/emails", json={**EMAIL, "subject": "Other"}, headers={"Idempotency-Key": "mail-1"}
    )
    assert (other.status_code, other.json()) == (422, {"error": "idempotency_key_reused"})
    as_push = await http.post("/v1/messages", json=PUSH, headers={"Idempotency-Key": "mail-1"})
    assert (as_push.status_code, as_push.json()["error"]) == (422, "idempotency_key_reused")
    assert await counts(db) == (1, 1, 1)
    view = (await http.get(f"/v1/messages/{message}")).json()
    assert view["devices"] == {"sent": 0, "failed": 0, "pending": 2}  # known at the door


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**EMAIL, "to": []}, "to"),
        ({**EMAIL, "to": ["ada@example.com", "not an address"]}, "to.1"),
        ({**EMAIL, "to": ["ada@exämple.com"]}, "to.0"),
        ({**EMAIL, "subject": "Shipped\r\nBcc: eve@example.com"}, "subject"),
        ({"to": ["ada@example.com"], "subject": "s"}, "text or html"),
        ({**EMAIL, "from": "nobody"}, "from"),
        ({**EMAIL, "reply_to": "a@b\nc"}, "reply_to"),
        ({**EMAIL, "headers": {"Subject": "again"}}, "headers.Subject"),
        ({**EMAIL, "headers": {"X-Order": "1\r\nBcc: eve@example.com"}}, "headers.X-Order"),
        ({**EMAIL, "headers": {"X-Order": 1042}}, "headers.X-Order"),
        ({**EMAIL, "to": [f"a{n}@example.com" for n in range(501)]}, "to"),
    ],
    ids=[
        "no-recipient",
        "not-an-address",
        "non-ascii-domain",
        "subject-injects-a-header",
        "no-body",
        "from-not-a-mailbox",
        "reply-to-line-break",
        "reserved-header",
        "header-injects-a-header",
        "header-not-text",
        "501-recipients",
    ],
)
async def test_an_email_the_worker_would_dead_letter_is_400_naming_its_field_and_stores_nothing(
    http: httpx.AsyncClient, db: DbConnection, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidEmailJob):
        parse_email_job(body)  # the worker refuses it too
    answer = await http.post("/v1/emails", json=body, headers={"Idempotency-Key": "k"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["details"][0]["field"] == field, answer.json()
    assert await counts(db) == (0, 0, 0)


_text = st.one_of(st.none(), st.integers(0, 1), st.text(max_size=4))
_emails = st.fixed_dictionaries(
    {},
    optional={
        "to": st.one_of(
            st.lists(
                st.sampled_from(["ada@example.com", "b@x.io", "x", "é@a.b", "a@b\n", ""]),
                max_size=3,
            ),
            _text,
        ),
        "subject": st.one_of(st.sampled_from(["Shipped", "a\rb", ""]), _text),
        "text": _text,
        "html": _text,
        "from": st.one_of(st.sampled_from(["Shop <shop@example.com>", "s@x.io", "nobody"]), _text),
        "reply_to": st.one_of(st.sampled_from(["h@x.io", "<>"]), _text),
        "headers": st.one_of(
            st.dictionaries(
                st.sampled_from(["X-Order", "Subject", "Bad Name", ""]),
                st.one_of(st.sampled_from(["1042", "a\nb"]), st.integers()),
                max_size=2,
            ),
            _text,
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(_emails)
def test_the_door_takes_an_email_body_exactly_when_the_worker_does(body: dict[str, Any]) -> None:
    """Bodies of the e-mail job's fields (no unknown ones): the door and the worker's parser
    agree on every one."""
    try:
        parsed = parse_email_job(body)
    except InvalidEmailJob:
        parsed = None
    try:
        _, job = email_job(decode_body("application/json", json.dumps(body).encode()))
    except Refusal as refused:
        assert parsed is None, (body, refused.body)
        return
    assert job == parsed, body


async def test_without_an_email_queue_the_route_is_501_saying_how_to_serve_it(
    db: DbConnection, settings: Settings
) -> None:
    async with (
        serve_in_process(db, settings.database, IngressSettings(queue="t.push")) as served,
        client(served) as http,
    ):
        refused = await http.post("/v1/emails", json=EMAIL, headers={"Idempotency-Key": "k"})
    assert refused.status_code == 501
    assert refused.json()["error"] == "kind_not_served"
    assert "--email-queue" in refused.json()["message"]
    assert "IW_INGRESS_EMAIL_QUEUE" in refused.json()["message"]
    assert await counts(db) == (0, 0, 0)


async def test_an_email_posted_reaches_each_recipient_once_and_a_replay_sends_nothing(
    harness: Harness, settings: Settings, fake_smtp: FakeSmtp
) -> None:
    """POST -> outbox -> relay -> e-mail worker -> aiosmtpd; a replayed POST sends nothing."""
    await harness.db.execute("CREATE TABLE suppressed (address text NOT NULL, reason text)")
    ingress = IngressSettings(queue="t.push", email_queue=harness.queue)
    async with (
        serve_in_process(harness.db, settings.database, ingress) as served,
        client(served) as http,
    ):
        first = await http.post("/v1/emails", json=EMAIL, headers={"Idempotency-Key": "o-1042"})
        assert first.status_code == 202, first.text
        message = first.json()["id"]
        async with harness.run(email_app(harness.queue, fake_smtp)), relaying(harness):

            async def sent() -> bool:
                view = (await http.get(f"/v1/messages/{message}")).json()
                return bool(view["devices"]["sent"] == 2)

            await wait_for(sent)
            replay = await http.post(
                "/v1/emails", json=EMAIL, headers={"Idempotency-Key": "o-1042"}
            )
            assert replay.json() == {"status": "duplicate_ignored", "id": message}

            async def relayed() -> bool:
                return not await harness.db.fetchval(
                    "SELECT count(*) FROM outbox WHERE published_at IS NULL"
                )

            await wait_for(relayed)
            await harness.wait_outcome("effect_committed", 1)
            view = (await http.get(f"/v1/messages/{message}")).json()
    assert sorted(fake_smtp.arrived_by_id().values()) == [1, 1]
    assert [m.rcpt_tos for m in fake_smtp.messages] in (
        [("ada@example.com",), ("bob@example.com",)],
        [("bob@example.com",), ("ada@example.com",)],
    )
    assert await harness.db.fetchval("SELECT count(*) FROM outbox") == 1
    assert view["devices"] == {"sent": 2, "failed": 0, "pending": 0}
    assert [(t["platform"], t["status"], t["address"]) for t in view["targets"]] == [
        ("email", "sent", "a…@example.com"),
        ("email", "sent", "b…@example.com"),
    ]
