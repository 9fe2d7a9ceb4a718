"""ApnsProvider through the real aioapns against FakeApns: answers and their errors."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from providers import (
    ApnsProvider,
    InvalidDeviceToken,
    Notification,
    PermanentProviderError,
    Platform,
    Priority,
    ProviderConfigurationError,
    ProviderError,
    Push,
    Target,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.fakes.apns import FakeApns
from tests.providers.pushes import ids_for, push_to

pytestmark = pytest.mark.timeout(20)


async def test_success_records_the_answered_apns_id(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    ids = ids_for("device-1")
    receipt = await apns.send(push_to("device-1", priority=Priority.HIGH, ttl_seconds=0), ids)

    assert receipt.provider == "apns"
    assert receipt.provider_message_id == ids.effect_id
    [request] = fake_apns.requests
    assert request.token == "device-1"
    assert request.apns_id == ids.effect_id
    assert request.collapse_id == ids.collapse_id
    assert request.headers["apns-topic"] == fake_apns.topic
    assert request.headers["apns-push-type"] == "alert"
    assert request.headers["apns-priority"] == "10"
    assert request.headers["apns-expiration"] == "0"
    assert request.headers["authorization"].startswith("bearer ")
    assert request.payload == {
        "aps": {"alert": {"title": "Your order shipped", "body": "It arrives Friday"}},
        "order": "1",
    }


@pytest.mark.parametrize(
    ("status", "reason", "error", "retry_after"),
    [
        (400, "BadDeviceToken", InvalidDeviceToken, None),
        (400, "DeviceTokenNotForTopic", InvalidDeviceToken, None),
        (410, "Unregistered", InvalidDeviceToken, None),
        (400, "TopicDisallowed", ProviderConfigurationError, None),
        (400, "BadTopic", ProviderConfigurationError, None),
        (403, "InvalidProviderToken", ProviderConfigurationError, None),
        (403, "ExpiredProviderToken", ProviderConfigurationError, None),
        (429, "TooManyProviderTokenUpdates", TransientProviderError, None),
        (413, "PayloadTooLarge", PermanentProviderError, None),
        (429, "TooManyRequests", TransientProviderError, 30.0),
        (500, "InternalServerError", TransientProviderError, None),
        (503, "ServiceUnavailable", TransientProviderError, 5.0),
    ],
)
async def test_error_answers_map_to_the_error_tree(
    apns: ApnsProvider,
    fake_apns: FakeApns,
    status: int,
    reason: str,
    error: type[ProviderError],
    retry_after: float | None,
) -> None:
    retry_header = int(retry_after) if retry_after is not None else None
    fake_apns.script("device-1", status=status, reason=reason, retry_after=retry_header)

    with pytest.raises(error) as raised:
        await apns.send(push_to("device-1"), ids_for("device-1"))

    assert type(raised.value) is error
    assert raised.value.status == status
    assert raised.value.reason == reason
    if isinstance(raised.value, TransientProviderError):
        assert raised.value.retry_after == retry_after
    assert len(fake_apns.requests) == 1


async def test_timeout_is_unknown_outcome_with_one_request(fake_apns: FakeApns) -> None:
    fake_apns.script("slow", latency=1.0, times=1)
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=0.3, max_connections=1))
    try:
        with pytest.raises(UnknownOutcomeError):
            await provider.send(push_to("slow"), ids_for("slow"))
        await asyncio.sleep(1.0)  # the late answer arrives and is ignored
        assert len(fake_apns.requests_for("slow")) == 1

        # the timed-out connection was abandoned; the next send opens a new one
        await provider.send(push_to("slow"), ids_for("slow", job="another"))
    finally:
        await provider.aclose()
    assert [r.connection_id for r in fake_apns.requests] == [1, 2]


async def test_connection_refused_is_transient_and_sends_nothing(fake_apns: FakeApns) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    provider = ApnsProvider(fake_apns.settings(port=port, timeout_seconds=2.0))
    try:
        with pytest.raises(TransientProviderError):
            await provider.send(push_to("device-1"), ids_for("device-1"))
    finally:
        await provider.aclose()
    assert fake_apns.requests == []


async def test_background_push_is_priority_5_with_content_available(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    target = Target(platform=Platform.IOS, token="device-1")
    silent = Push(target=target, notification=Notification(data={"k": "v"}))
    await apns.send(silent, ids_for("device-1"))

    [request] = fake_apns.requests
    assert request.headers["apns-push-type"] == "background"
    assert request.headers["apns-priority"] == "5"
    assert json.loads(request.body) == {"aps": {"content-available": 1}, "k": "v"}


async def test_non_ios_target_is_refused_without_sending(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    with pytest.raises(PermanentProviderError):
        await apns.send(push_to("device-1", Platform.ANDROID), ids_for("device-1"))
    assert fake_apns.requests == []


async def test_send_after_aclose_is_transient(apns: ApnsProvider, fake_apns: FakeApns) -> None:
    await apns.send(push_to("device-1"), ids_for("device-1"))
    await apns.aclose()
    with pytest.raises(TransientProviderError, match="ProviderClosed"):
        await apns.send(push_to("device-2"), ids_for("device-2"))
    assert len(fake_apns.requests) == 1


def test_settings_need_exactly_one_kind_of_auth() -> None:
    from providers import ApnsSettings

    with pytest.raises(ValueError, match="either"):
        ApnsProvider(ApnsSettings(topic="com.example.app"))
