"""Case 3 and 4 of issue 9 for APNs: unprocessed streams are transient, credential and
configuration answers are ours to fix, and one provider token serves every connection."""

from __future__ import annotations

import asyncio

import pytest

from providers import (
    ApnsProvider,
    ProviderConfigurationError,
    ProviderReceipt,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.apns_token import ApnsToken
from providers.fakes.apns import ApnsReply, FakeApns
from tests.providers.pushes import push_to, send_or_error


async def test_refused_stream_is_transient_never_unknown(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    fake_apns.script("refused", refuse=True, times=1)
    answer = await send_or_error(apns, push_to("refused"))
    assert type(answer) is TransientProviderError, answer
    assert answer.reason == "RefusedStream"
    assert isinstance(
        await send_or_error(apns, push_to("refused")), ProviderReceipt
    )  # a resend is safe
    assert len(fake_apns.requests_for("refused")) == 2


async def test_goaway_unprocessed_stream_is_transient_processed_one_unknown(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    fake_apns.script("in-progress", latency=1.0)
    fake_apns.script("after-last", goaway=True)
    first = asyncio.create_task(send_or_error(apns, push_to("in-progress")))
    while not fake_apns.requests:
        await asyncio.sleep(0.01)
    second = await send_or_error(apns, push_to("after-last"))
    assert type(second) is TransientProviderError, second  # above last_stream_id
    assert isinstance(await first, UnknownOutcomeError)  # at or below: may have been processed


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (403, "InvalidProviderToken"),
        (403, "ExpiredProviderToken"),
        (400, "BadTopic"),
        (400, "TopicDisallowed"),
    ],
)
async def test_credential_and_configuration_answers_fail_no_push(
    apns: ApnsProvider, fake_apns: FakeApns, status: int, reason: str
) -> None:
    fake_apns.script("device", status=status, reason=reason)
    answer = await send_or_error(apns, push_to("device"))
    assert isinstance(answer, ProviderConfigurationError), answer
    assert isinstance(answer, TransientProviderError)  # not sent: a later resend is safe
    assert answer.reason == reason


async def test_one_provider_token_is_shared_by_every_connection() -> None:
    async with FakeApns(max_concurrent_streams=2, unscripted=ApnsReply(latency=0.2)) as fake:
        provider = ApnsProvider(fake.settings(max_connections=5))
        try:
            answers = await asyncio.gather(
                *(send_or_error(provider, push_to(f"d-{n}")) for n in range(20))
            )
        finally:
            await provider.aclose()
    assert all(isinstance(a, ProviderReceipt) for a in answers), answers
    assert fake.connections_opened >= 3
    assert len(fake.provider_tokens) == 1


def test_provider_token_is_refreshed_between_20_and_55_minutes_of_age(
    fake_apns_key: str,
) -> None:
    now = [1_000_000.0]
    token = ApnsToken(key=fake_apns_key, key_id="K", team_id="T", clock=lambda: now[0])
    first = token.get_header()
    now[0] += 19 * 60
    token.refused("ExpiredProviderToken")  # but 20 minutes have not passed: keep it
    assert token.get_header() == first
    now[0] += 30 * 60  # 49 minutes old
    assert token.get_header() == first
    now[0] += 60  # 50 minutes: due
    second = token.get_header()
    assert second != first
    now[0] += 21 * 60
    token.refused("InvalidProviderToken")  # not about its age
    assert token.get_header() == second
    token.refused("ExpiredProviderToken")
    assert token.get_header() != second
    assert token.signed == 3
    for outside in (19 * 60, 56 * 60):
        with pytest.raises(ValueError, match="refresh_seconds"):
            ApnsToken(key=fake_apns_key, key_id="K", team_id="T", refresh_seconds=outside)


@pytest.fixture
def fake_apns_key(fake_apns: FakeApns) -> str:
    key = fake_apns.settings().key
    assert key is not None
    return key
