"""The payments API of the tests and of docs/effects.md's example, two ways: one that
replays by key within Stripe's 24 hours, one whose provider is asked by key first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers import LOOKUP_BY_KEY, ApiCall, ApiRequest, IdempotentApi, InvalidCall, replays_within


class PaymentsApi(IdempotentApi):
    """Charges through `POST /v1/charges`, as `providers.fakes.FakePayments` takes them."""

    name = "payments"
    recovery = replays_within(24 * 3600)
    address_field = "customer"

    @classmethod
    def validate(cls, body: Mapping[str, Any]) -> None:
        amount = body.get("amount")
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            raise InvalidCall("amount: a positive integer, in the currency's smallest unit")
        currency = body.get("currency")
        if not isinstance(currency, str) or len(currency) != 3:
            raise InvalidCall("currency: a three-letter ISO code")

    def request(self, call: ApiCall) -> ApiRequest:
        body = call.body
        form = {
            "amount": str(body["amount"]),
            "currency": body["currency"],
            "customer": body["customer"],
            "metadata[tenant]": call.tenant,
        }
        return ApiRequest(method="POST", path="/v1/charges", form=form)


class LookedUpPaymentsApi(PaymentsApi):
    """The same API, asked by key before a second call (the fake's lookup)."""

    name = "payments_lookup"
    recovery = LOOKUP_BY_KEY

    def lookup_request(self, call: ApiCall, key: str) -> ApiRequest:
        return ApiRequest(method="GET", path="/v1/charges", params={"idempotency_key": key})
