"""The e-mail and API job formats: what the publisher's builders and the worker refuse alike."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from consumers import (
    EMAIL,
    ApiKind,
    ConfigurationError,
    InvalidEmailJob,
    InvalidJob,
    Recipient,
    api_job_body,
    email_job_body,
    parse_email_job,
)
from consumers.jobs.email import MAX_RECIPIENTS
from providers import ApiCall, ApiRequest, IdempotentApi, replays_within
from tests.apps.payments import PaymentsApi


def test_an_email_job_has_one_recipient_per_distinct_address_domains_lower_cased() -> None:
    job = parse_email_job(
        email_job_body(
            to=["Ada@Example.COM", "bob@example.com", "Ada@example.com"],
            subject="Shipped",
            text="On its way",
        )
    )
    assert job.to == ("Ada@example.com", "bob@example.com")  # the mailbox's case is its own


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"subject": "s", "text": "t"}, "to"),
        ({"to": [], "subject": "s", "text": "t"}, "to"),
        ({"to": "ada@example.com", "subject": "s", "text": "t"}, "to"),
        ({"to": ["ada@example.com", "nope"], "subject": "s", "text": "t"}, "to[1]"),
        ({"to": ["ada@example.com"], "text": "t"}, "subject"),
        ({"to": ["ada@example.com"], "subject": "a\nb", "text": "t"}, "subject"),
        ({"to": ["ada@example.com"], "subject": "s"}, "text or html"),
        ({"to": ["ada@example.com"], "subject": "s", "text": 5}, "text"),
        ({"to": ["ada@example.com"], "subject": "s", "html": "a\x00"}, "html"),
        ({"to": ["ada@example.com"], "subject": "s", "text": "t", "from": "a@b, c@d"}, "from"),
        ({"to": ["ada@example.com"], "subject": "s", "text": "t", "reply_to": "x"}, "reply_to"),
        ({"to": ["ada@example.com"], "subject": "s", "text": "t", "headers": []}, "headers"),
        (
            {
                "to": ["ada@example.com"],
                "subject": "s",
                "text": "t",
                "headers": {"X-A": "1\r\nB: 2"},
            },
            "headers.X-A",
        ),
        (
            {"to": ["ada@example.com"], "subject": "s", "text": "t", "headers": {"To": "x"}},
            "headers.To",
        ),
    ],
)
def test_an_email_job_that_cannot_be_sent_is_refused_naming_its_field(
    body: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidEmailJob) as refused:
        parse_email_job(body)
    assert str(refused.value).startswith(f"{field}:") or str(refused.value).startswith(field)


def test_the_builder_refuses_what_the_worker_would_dead_letter() -> None:
    with pytest.raises(InvalidEmailJob, match="to"):
        email_job_body(
            to=[f"r{n}@example.com" for n in range(MAX_RECIPIENTS + 1)], subject="s", text="t"
        )
    body = email_job_body(
        to=["ada@example.com"],
        subject="s",
        html="<p>h</p>",
        sender="Shop <shop@example.com>",
        reply_to="help@example.com",
        headers={"X-Order": "1"},
    )
    assert body["from"] == "Shop <shop@example.com>"
    email = parse_email_job(body).email_for("ada@example.com")
    assert (email.sender, email.reply_to, dict(email.headers)) == (
        "Shop <shop@example.com>",
        "help@example.com",
        {"X-Order": "1"},
    )


def test_an_email_job_weighs_its_addresses_before_it_is_parsed() -> None:
    body = json.dumps({"to": ["a@example.com"] * 7, "subject": "s", "text": "t"}).encode()
    assert EMAIL.weigh(body, max_body_bytes=1 << 20) == 7
    assert EMAIL.weigh(b"not json", max_body_bytes=1 << 20) == 1
    assert EMAIL.weigh(body, max_body_bytes=10) == 1


async def test_an_api_job_is_one_call_to_its_address_and_carries_its_tenant() -> None:
    kind = ApiKind(PaymentsApi)
    job = kind.parse(api_job_body(PaymentsApi, {"amount": 1, "currency": "usd", "customer": "c"}))
    (recipients,) = await kind.recipients(None, [("acme", job)])  # type: ignore[arg-type]
    assert recipients == [Recipient(channel="payments", address="c")]
    call = await kind.effect(job, 0, recipients[0], tenant="acme")
    assert call == ApiCall(tenant="acme", body={"amount": 1, "currency": "usd", "customer": "c"})
    assert kind.name == "payments"


class Bare(IdempotentApi):
    """No address field, a validate that trips over a missing key."""

    name = "bare"
    base_url = "http://127.0.0.1:1"
    recovery = replays_within(60)

    @classmethod
    def validate(cls, body: Mapping[str, Any]) -> None:
        if body["kind"] != "ok":
            raise ValueError("kind: ok")

    def request(self, call: ApiCall) -> ApiRequest:
        return ApiRequest(method="POST", path="/")


async def test_an_api_job_its_class_refuses_is_invalid_whatever_its_validate_raised() -> None:
    kind = ApiKind(Bare)
    assert (await kind.recipients(None, [("", kind.parse({"kind": "ok"}))]))[0] == [  # type: ignore[arg-type]
        Recipient(channel="bare", address="bare")
    ]
    with pytest.raises(InvalidJob, match="kind: ok"):
        kind.parse({"kind": "no"})
    with pytest.raises(InvalidJob, match="KeyError"):
        kind.parse({})
    with pytest.raises(InvalidJob, match="customer"):
        ApiKind(PaymentsApi).parse({"amount": 1, "currency": "usd", "customer": ""})
    assert (
        ApiKind(PaymentsApi).parse({"amount": 1, "currency": "usd", "customer": 42}).address == "42"
    )


def test_an_api_whose_name_cannot_name_events_is_refused_when_registered() -> None:
    class Spaced(Bare):
        name = "my api"

    with pytest.raises(ConfigurationError, match="name"):
        ApiKind(Spaced)
