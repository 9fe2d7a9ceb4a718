"""Case 3 and 4 of issue 9 for FCM: our credentials refused is ours to fix, and one
OAuth access token serves every send, fetched again before it expires, once at a time."""

from __future__ import annotations

import asyncio

import pytest

from providers import (
    FcmProvider,
    ProviderConfigurationError,
    ProviderReceipt,
    TransientProviderError,
)
from providers.fakes.fcm import FakeFcm
from tests.providers.pushes import fcm_push, send_or_error


async def test_one_access_token_is_shared_by_every_send(fake_fcm: FakeFcm) -> None:
    provider = FcmProvider(fake_fcm.settings(max_connections=32))
    try:
        answers = await asyncio.gather(
            *(send_or_error(provider, fcm_push(f"d-{n}")) for n in range(400))
        )
    finally:
        await provider.aclose()
    assert all(isinstance(a, ProviderReceipt) for a in answers)
    assert fake_fcm.token_requests == 1
    assert provider.token.fetched == 1


async def test_access_token_is_fetched_again_before_it_expires(fake_fcm: FakeFcm) -> None:
    # google-auth refreshes 225 s before expiry: a 227 s token is due after 2 s.
    fake_fcm.token_lifetime = 227
    provider = FcmProvider(fake_fcm.settings(max_connections=4))
    try:
        assert isinstance(await send_or_error(provider, fcm_push("first")), ProviderReceipt)
        assert isinstance(await send_or_error(provider, fcm_push("second")), ProviderReceipt)
        await asyncio.sleep(2.5)
        assert isinstance(await send_or_error(provider, fcm_push("third")), ProviderReceipt)
    finally:
        await provider.aclose()
    assert fake_fcm.token_requests == 2
    assert fake_fcm.refused_requests == 0  # never sent with an expired token


@pytest.mark.parametrize(
    ("status", "code"),
    [(401, None), (403, "PERMISSION_DENIED"), (401, "THIRD_PARTY_AUTH_ERROR")],
)
async def test_credential_answers_fail_no_push(
    fcm: FcmProvider, fake_fcm: FakeFcm, status: int, code: str | None
) -> None:
    fake_fcm.script("device", status=status, error_code=code)
    answer = await send_or_error(fcm, fcm_push("device"))
    assert isinstance(answer, ProviderConfigurationError), answer
    assert isinstance(answer, TransientProviderError)  # not sent: a later resend is safe
    assert len(fake_fcm.requests) == 1


async def test_refused_oauth_grant_fails_no_push_and_sends_nothing(
    fcm: FcmProvider, fake_fcm: FakeFcm
) -> None:
    fake_fcm.refuse_tokens = True
    answer = await send_or_error(fcm, fcm_push("device"))
    assert isinstance(answer, ProviderConfigurationError), answer
    assert answer.reason == "AccessTokenRefused"
    assert fake_fcm.requests == []
    fake_fcm.refuse_tokens = False
    assert isinstance(
        await send_or_error(fcm, fcm_push("device")), ProviderReceipt
    )  # fixed: sends again


async def test_a_send_cancelled_while_the_token_is_fetched_leaves_one_fetch(
    fake_fcm: FakeFcm,
) -> None:
    # The fetch runs in a thread that a cancelled send cannot stop: the next send
    # waits for that fetch instead of starting a second one beside it.
    fake_fcm.token_latency = 0.5
    provider = FcmProvider(fake_fcm.settings(timeout_seconds=2.0))
    try:
        first = asyncio.create_task(send_or_error(provider, fcm_push("first")))
        async with asyncio.timeout(5.0):
            while fake_fcm.token_requests == 0:
                await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert isinstance(await send_or_error(provider, fcm_push("second")), ProviderReceipt)
    finally:
        await provider.aclose()
    assert fake_fcm.token_requests == 1
    assert provider.token.fetched == 1
    assert [r.token for r in fake_fcm.requests] == ["second"]
