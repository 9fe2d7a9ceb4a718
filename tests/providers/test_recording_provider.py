"""RecordingProvider and PlatformRouter: the in-memory pieces users compose in their tests."""

from __future__ import annotations

import pytest

from providers import (
    InvalidDeviceToken,
    Notification,
    Platform,
    PlatformRouter,
    Provider,
    ProviderReceipt,
    Push,
    RecordingProvider,
    Target,
    send_ids,
)

pytestmark = pytest.mark.timeout(10)


def push_to(token: str, platform: Platform) -> Push:
    return Push(target=Target(platform=platform, token=token), notification=Notification(title="t"))


async def test_records_sends_and_answers_as_scripted() -> None:
    provider = RecordingProvider()
    provider.script("gone", InvalidDeviceToken("Unregistered", status=410))
    ids = send_ids("job-1", "ok")

    receipt = await provider.send(push_to("ok", Platform.IOS), ids)
    with pytest.raises(InvalidDeviceToken):
        await provider.send(push_to("gone", Platform.IOS), send_ids("job-1", "gone"))
    await provider.send(push_to("gone", Platform.IOS), send_ids("job-1", "gone"))

    assert receipt == ProviderReceipt(provider="recording", provider_message_id=ids.effect_id)
    assert [s.push.target.token for s in provider.sends] == ["ok", "gone", "gone"]
    assert len(provider.sends_to("gone")) == 2


async def test_router_sends_ios_to_apns_and_the_rest_to_fcm() -> None:
    apns, fcm = RecordingProvider("apns"), RecordingProvider("fcm")
    router: Provider = PlatformRouter(apns=apns, fcm=fcm)

    for platform in Platform:
        await router.send(push_to(platform.value, platform), send_ids("job", platform.value))
    await router.aclose()

    assert [s.push.target.token for s in apns.sends] == ["ios"]
    assert [s.push.target.token for s in fcm.sends] == ["android", "web"]
    assert apns.closed and fcm.closed
