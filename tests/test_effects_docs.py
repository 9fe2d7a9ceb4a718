"""docs/effects.md's examples run as written: the API subclass makes a charge through a
real worker against the fake payments API, its lookup form finds it, and the e-mail
handler example builds its app."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from consumers import App, Worker, api_job_body
from consumers.broker.topology import delete
from providers import ApiCall, ApiSettings, SendIds
from providers.fakes.payments import FakePayments
from tests.harness import Harness
from tests.support import wait_for

DOC = Path(__file__).resolve().parent.parent / "docs" / "effects.md"
QUEUE = "payments.charges"  # the example's own


def _blocks(section: str) -> list[str]:
    """The python code blocks of the `## section` of docs/effects.md, in order."""
    text = DOC.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    return re.findall(r"```python\n(.*?)```", body, re.S)


def _run(code: str, namespace: dict[str, Any]) -> dict[str, Any]:
    exec(compile(code, str(DOC), "exec"), namespace)
    return namespace


async def test_the_api_example_charges_once_through_a_worker_and_its_lookup_finds_it(
    harness: Harness, channel: aio_pika.abc.AbstractChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    subclass, lookup = _blocks("APIs with idempotency keys")
    async with FakePayments(api_key="sk_test_docs") as fake:
        monkeypatch.setenv("PAYMENTS_URL", fake.base_url)
        monkeypatch.setenv("PAYMENTS_KEY", "sk_test_docs")
        example = _run(subclass, {"__name__": "effects_example"})
        app: App = example["app"]
        payments = example["PaymentsApi"]
        retry = app.specs[QUEUE].retry
        await delete(channel, QUEUE, retry)  # what an interrupted run may have left
        try:
            async with Worker(app, harness.settings):
                body = api_job_body(payments, {"amount": 2000, "currency": "usd", "customer": "c1"})
                await harness.publisher.publish(QUEUE, body, message_id="order-1042", tenant="acme")

                async def sent() -> bool:
                    status = await harness.db.fetchval("SELECT status FROM send_ledger")
                    return bool(status == "sent")

                await wait_for(sent, timeout=30)
        finally:
            await delete(channel, QUEUE, retry)
        (charge,) = fake.charges.values()
        assert (charge["amount"], charge["customer"]) == (2000, "c1")
        assert fake.requests[0].params["metadata[tenant]"] == "acme"
        with pytest.raises(ValueError, match="amount"):
            api_job_body(payments, {"amount": -1, "currency": "usd", "customer": "c1"})

        looked_up = _run(lookup, example)["LookedUpPaymentsApi"]
        api = looked_up(
            ApiSettings(base_url=fake.base_url, headers={"Authorization": "Bearer sk_test_docs"})
        )
        key = await harness.db.fetchval("SELECT effect_id::text FROM send_ledger")
        ids = SendIds(effect_id=key, collapse_id="", fcm_collapse_key="", webpush_topic="")
        found = await api.look_up(ApiCall(tenant="acme", body=body), ids)
        assert found is not None and found.provider_message_id == charge["id"]
        await api.aclose()


def test_the_email_example_builds_its_app() -> None:
    (handler,) = _blocks("E-mail")
    app: App = _run(handler, {"__name__": "effects_email_example"})["app"]
    assert set(app.specs) == {"emails", "orders.shipped"}
    effects = app.specs["emails"].effects
    assert effects is not None and effects.kind.name == "email"
