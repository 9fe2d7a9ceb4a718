"""IdempotentApi through httpx against the fake payments API (Stripe's key semantics).

Each test names what the provider answers and what the sender makes of it; the
fake counts the charges actually made per key.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from providers import (
    LOOKUP_BY_KEY,
    ApiCall,
    ApiRequest,
    ApiSettings,
    IdempotentApi,
    NotStartedInTime,
    PermanentProviderError,
    ProviderConfigurationError,
    SendIds,
    TransientProviderError,
    UnknownOutcomeError,
    replays_within,
    send_ids,
)
from providers.fakes.payments import FakePayments
from tests.apps.payments import LookedUpPaymentsApi, PaymentsApi

TIMEOUT_S = 1.0


def _settings(fake: FakePayments) -> ApiSettings:
    return ApiSettings(
        base_url=fake.base_url, timeout_seconds=TIMEOUT_S, connect_timeout_seconds=TIMEOUT_S / 2
    )


@pytest.fixture
async def api(fake_payments: FakePayments) -> AsyncIterator[PaymentsApi]:
    made = PaymentsApi(_settings(fake_payments))
    yield made
    await made.aclose()


def _call(customer: str = "cus_1", amount: int = 2000, tenant: str = "acme") -> ApiCall:
    return ApiCall(tenant=tenant, body={"amount": amount, "currency": "usd", "customer": customer})


def _ids(customer: str = "cus_1") -> SendIds:
    return send_ids("order-1042-paid", customer)


async def test_a_call_is_one_request_with_the_effects_key_and_its_receipt_is_the_charge(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    ids = _ids()
    receipt = await api.send(_call(), ids)
    (request,) = fake_payments.requests
    assert request.key == ids.effect_id
    assert request.params["metadata[tenant]"] == "acme"  # the tenant reaches the request
    assert receipt.provider == "payments"
    assert receipt.provider_message_id in fake_payments.charges
    assert fake_payments.created_by_key == {ids.effect_id: 1}


async def test_the_same_key_and_body_again_is_replayed_and_charges_once(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    first = await api.send(_call(), _ids())
    second = await api.send(_call(), _ids())
    assert first == second
    assert [r.replayed for r in fake_payments.requests] == [False, True]
    assert fake_payments.created_by_key[_ids().effect_id] == 1


async def test_the_same_key_with_other_parameters_is_permanent_and_says_the_key_was_reused(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    await api.send(_call(amount=2000), _ids())
    with pytest.raises(PermanentProviderError) as raised:
        await api.send(_call(amount=3000), _ids())
    assert raised.value.reason.startswith("idempotency_key_reused")
    assert raised.value.status == 400
    assert len(fake_payments.charges) == 1


async def test_a_call_in_progress_with_the_key_is_transient_with_a_short_retry(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    fake_payments.script("cus_1", latency=TIMEOUT_S / 2, times=1)
    first = asyncio.create_task(api.send(_call(), _ids()))

    async def in_progress() -> None:
        while not fake_payments._keys:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(in_progress(), TIMEOUT_S)
    with pytest.raises(TransientProviderError) as raised:
        await api.send(_call(), _ids())
    assert raised.value.status == 409
    assert raised.value.retry_after == api.in_progress_retry_seconds
    await first
    assert fake_payments.created_by_key[_ids().effect_id] == 1


@pytest.mark.parametrize("status", [429, 503])
async def test_429_and_503_are_transient_with_retry_after_and_the_retry_charges_once(
    api: PaymentsApi, fake_payments: FakePayments, status: int
) -> None:
    fake_payments.script("cus_1", status=status, retry_after=7, times=1)
    with pytest.raises(TransientProviderError) as raised:
        await api.send(_call(), _ids())
    assert (raised.value.status, raised.value.retry_after) == (status, 7)
    await api.send(_call(), _ids())
    assert fake_payments.created_by_key[_ids().effect_id] == 1


async def test_a_500_is_transient_and_kept_by_the_provider_as_stripe_documents(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    fake_payments.script("cus_1", status=500, times=1)
    for _ in range(2):  # the second gets the kept 500 back, not a new try
        with pytest.raises(TransientProviderError):
            await api.send(_call(), _ids())
    assert [r.replayed for r in fake_payments.requests] == [False, True]
    assert fake_payments.charges == {}


async def test_our_credentials_refused_is_a_configuration_error() -> None:
    async with FakePayments(api_key="sk_right") as fake:
        wrong = PaymentsApi(
            ApiSettings(base_url=fake.base_url, headers={"Authorization": "Bearer sk_wrong"})
        )
        with pytest.raises(ProviderConfigurationError):
            await wrong.send(_call(), _ids())
        right = PaymentsApi(
            ApiSettings(base_url=fake.base_url, headers={"Authorization": "Bearer sk_right"})
        )
        await right.send(_call(), _ids())  # a 401 is not kept: the key is still free
        await wrong.aclose()
        await right.aclose()
        assert len(fake.charges) == 1
        assert "sk_right" not in repr(right.settings)


async def test_a_request_the_provider_refuses_is_permanent_not_a_reused_key(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    call = ApiCall(tenant="", body={"amount": 1, "currency": "", "customer": "cus_1"})
    with pytest.raises(PermanentProviderError) as raised:
        await api.send(call, _ids())
    assert raised.value.reason == "HTTP400 invalid_request_error"


async def test_silence_after_the_request_is_unknown_and_the_call_again_is_replayed(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    fake_payments.script("cus_1", silent=True, times=1)
    started = time.monotonic()
    with pytest.raises(UnknownOutcomeError):
        await api.send(_call(), _ids())
    assert time.monotonic() - started < api.answer_seconds * 2
    receipt = await api.send(_call(), _ids())  # what the ledger does within the window
    assert receipt.provider_message_id in fake_payments.charges
    assert fake_payments.created_by_key[_ids().effect_id] == 1
    assert fake_payments.posts_with_key(_ids().effect_id)[-1].replayed


async def test_a_refused_connection_is_transient(fake_payments: FakePayments) -> None:
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    api = PaymentsApi(ApiSettings(base_url=f"http://127.0.0.1:{port}"))
    with pytest.raises(TransientProviderError, match="ConnectError"):
        await api.send(_call(), _ids())
    await api.aclose()


async def test_the_providers_window_ends_and_the_same_key_charges_again(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    """Why the ledger never calls again past the window (tests/test_api_effects.py)."""
    await api.send(_call(), _ids())
    fake_payments.advance(24 * 3600 + 1)
    await api.send(_call(), _ids())
    assert fake_payments.created_by_key[_ids().effect_id] == 2


async def test_a_lookup_finds_the_call_that_arrived_and_nothing_for_one_that_did_not(
    fake_payments: FakePayments,
) -> None:
    api = LookedUpPaymentsApi(_settings(fake_payments))
    assert await api.look_up(_call(), _ids()) is None
    made = await api.send(_call(), _ids())
    assert await api.look_up(_call(), _ids()) == made
    assert await api.look_up(_call("cus_2"), _ids("cus_2")) is None
    assert len(fake_payments.lookups()) == 3
    await api.aclose()


async def test_a_lookup_that_cannot_ask_is_transient(fake_payments: FakePayments) -> None:
    api = LookedUpPaymentsApi(ApiSettings(base_url="http://127.0.0.1:1"))
    with pytest.raises(TransientProviderError, match="LookupFailed"):
        await api.look_up(_call(), _ids())
    await api.aclose()


async def test_no_call_starts_that_could_not_be_answered_before_its_deadline(
    api: PaymentsApi, fake_payments: FakePayments
) -> None:
    with pytest.raises(NotStartedInTime):
        await api.send(_call(), _ids(), deadline=time.monotonic() + api.answer_seconds / 2)
    assert fake_payments.requests == []


def test_a_subclass_missing_what_it_must_give_is_refused_when_built() -> None:
    class NoRequest(IdempotentApi):
        name = "x"
        base_url = "http://127.0.0.1:1"
        recovery = replays_within(60)

    class NoLookup(NoRequest):
        recovery = LOOKUP_BY_KEY

        def request(self, call: ApiCall) -> ApiRequest:
            return ApiRequest(method="POST", path="/")

    class NoBase(NoLookup):
        base_url = ""
        recovery = replays_within(60)

    with pytest.raises(TypeError, match="request"):
        NoRequest()
    with pytest.raises(TypeError, match="lookup_request"):
        NoLookup()
    with pytest.raises(TypeError, match="base_url"):
        NoBase()
