"""The payments API of the API profiles: Stripe's charges, as the fake payments API takes them.

Two ways after a crash: `Payments` replays by key within Stripe's 24 hours (the
ledger calls again with the same Idempotency-Key, and the provider answers with
the first call's answer); `LookedUpPayments` is asked by key first (the fake's
`GET /v1/charges?idempotency_key=`, as Svix and Postmark can be asked) and called
again only if the first call never arrived.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers import LOOKUP_BY_KEY, ApiCall, ApiRequest, InvalidCall, replays_within
from providers.idempotent_api import IdempotentApi


class Payments(IdempotentApi):
    """Charges through `POST /v1/charges`, form-encoded as Stripe takes them."""

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


class LookedUpPayments(Payments):
    """The same charges, asked by key before a second call."""

    name = "payments_lookup"
    recovery = LOOKUP_BY_KEY

    def lookup_request(self, call: ApiCall, key: str) -> ApiRequest:
        return ApiRequest(method="GET", path="/v1/charges", params={"idempotency_key": key})
