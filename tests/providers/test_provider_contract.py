"""One contract, four providers: what every `Provider` promises its caller.

The same tests run against `RecordingProvider` (the stub users test with),
`ApnsProvider` through aioapns to the fake APNs, `FcmProvider` through
pyfcm to the fake FCM, and `WebPushProvider` through pywebpush to the fake push
service (which verifies the VAPID JWT and decrypts every request). A stub
that answers differently from the real thing would make users' tests lie;
this suite is where that would show.

The promises: one call is one attempt (exactly one request per send, never
a resend of its own); a receipt names the provider and its message id; an
unregistered token is `InvalidDeviceToken`; 429 is transient with its
Retry-After; 5xx is transient; no answer in time is `UnknownOutcomeError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import pytest

from providers import (
    ApnsProvider,
    FcmProvider,
    InvalidDeviceToken,
    Notification,
    Platform,
    Provider,
    ProviderReceipt,
    Push,
    RecordingProvider,
    SendIds,
    Target,
    TransientProviderError,
    UnknownOutcomeError,
    WebPushProvider,
    send_ids,
)
from providers.fakes import FakeApns, FakeFcm, FakeWebPush

TIMEOUT_S = 0.5


class Answer(StrEnum):
    UNREGISTERED = "unregistered"
    THROTTLED = "throttled"  # 429 with Retry-After: 7
    UNAVAILABLE = "unavailable"  # 503
    SILENT = "silent"  # answers after the provider's timeout


@dataclass(frozen=True, slots=True, kw_only=True)
class Subject:
    """A provider under contract, with a way to script its far side and count requests."""

    provider: Provider
    platform: Platform
    script: Callable[[str, Answer], None]
    requests: Callable[[str], int]
    target: Callable[[str], Target] | None = None  # the device named so, when not a token


def _recording() -> Subject:
    recording = RecordingProvider()
    errors = {
        Answer.UNREGISTERED: InvalidDeviceToken("Unregistered", status=410),
        Answer.THROTTLED: TransientProviderError("TooManyRequests", status=429, retry_after=7),
        Answer.UNAVAILABLE: TransientProviderError("ServiceUnavailable", status=503),
        Answer.SILENT: UnknownOutcomeError("timeout"),
    }
    return Subject(
        provider=recording,
        platform=Platform.IOS,
        script=lambda token, answer: recording.script(token, errors[answer]),
        requests=lambda token: len(recording.sends_to(token)),
    )


# How each fake is told to give each answer; only the dead-token status differs.
FAKE_SCRIPTS: dict[Answer, dict[str, Any]] = {
    Answer.THROTTLED: {"status": 429, "retry_after": 7},
    Answer.UNAVAILABLE: {"status": 503},
    Answer.SILENT: {"latency": TIMEOUT_S * 3},
}


def _apns(fake: FakeApns) -> Subject:
    scripts = {**FAKE_SCRIPTS, Answer.UNREGISTERED: {"status": 410}}
    return Subject(
        provider=ApnsProvider(fake.settings(timeout_seconds=TIMEOUT_S)),
        platform=Platform.IOS,
        script=lambda token, answer: fake.script(token, **scripts[answer]),
        requests=lambda token: len(fake.requests_for(token)),
    )


def _fcm(fake: FakeFcm) -> Subject:
    scripts = {**FAKE_SCRIPTS, Answer.UNREGISTERED: {"status": 404}}
    return Subject(
        provider=FcmProvider(fake.settings(timeout_seconds=TIMEOUT_S)),
        platform=Platform.ANDROID,
        script=lambda token, answer: fake.script(token, **scripts[answer]),
        requests=lambda token: len(fake.requests_for(token)),
    )


def _webpush(fake: FakeWebPush) -> Subject:
    scripts = {**FAKE_SCRIPTS, Answer.UNREGISTERED: {"status": 410}}
    return Subject(
        provider=WebPushProvider(fake.settings(timeout_seconds=TIMEOUT_S)),
        platform=Platform.WEB,
        script=lambda name, answer: fake.script(name, **scripts[answer]),
        requests=lambda name: len(fake.requests_for(name)),
        target=lambda name: fake.subscribe(name).target,
    )


@pytest.fixture(params=["recording", "apns", "fcm", "webpush"])
async def subject(
    request: pytest.FixtureRequest,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> AsyncIterator[Subject]:
    builders: dict[str, Callable[[], Subject]] = {
        "recording": _recording,
        "apns": lambda: _apns(fake_apns),
        "fcm": lambda: _fcm(fake_fcm),
        "webpush": lambda: _webpush(fake_webpush),
    }
    made = builders[request.param]()
    yield made
    await made.provider.aclose()
    assert fake_webpush.refusals == []  # every web request's VAPID and encryption passed


def _push(subject: Subject, name: str) -> tuple[Push, SendIds]:
    target = Target(platform=subject.platform, token=name)
    if subject.target is not None:
        target = subject.target(name)
    push = Push(
        target=target,
        notification=Notification(title="Shipped", body="Order 1042", data={"order": "1042"}),
    )
    return push, send_ids("order-1042-shipped", target.token)


async def test_a_send_is_one_request_and_its_receipt_names_provider_and_message(
    subject: Subject,
) -> None:
    push, ids = _push(subject, "device-ok")
    receipt = await subject.provider.send(push, ids)
    assert isinstance(receipt, ProviderReceipt)
    assert receipt.provider == subject.provider.name
    assert receipt.provider_message_id
    assert subject.requests("device-ok") == 1


async def test_the_same_ids_sent_twice_are_two_requests_never_deduplicated_silently(
    subject: Subject,
) -> None:
    push, ids = _push(subject, "device-twice")
    first = await subject.provider.send(push, ids)
    second = await subject.provider.send(push, ids)
    assert subject.requests("device-twice") == 2
    assert first.provider == second.provider


async def test_unregistered_token_is_invalid_device_token_after_one_request(
    subject: Subject,
) -> None:
    subject.script("device-gone", Answer.UNREGISTERED)
    push, ids = _push(subject, "device-gone")
    with pytest.raises(InvalidDeviceToken):
        await subject.provider.send(push, ids)
    assert subject.requests("device-gone") == 1


async def test_429_is_transient_with_its_retry_after_and_not_retried_inside(
    subject: Subject,
) -> None:
    subject.script("device-throttled", Answer.THROTTLED)
    push, ids = _push(subject, "device-throttled")
    with pytest.raises(TransientProviderError) as raised:
        await subject.provider.send(push, ids)
    assert raised.value.retry_after == pytest.approx(7, abs=1)
    assert subject.requests("device-throttled") == 1


async def test_5xx_is_transient_and_not_retried_inside(subject: Subject) -> None:
    subject.script("device-5xx", Answer.UNAVAILABLE)
    push, ids = _push(subject, "device-5xx")
    with pytest.raises(TransientProviderError):
        await subject.provider.send(push, ids)
    assert subject.requests("device-5xx") == 1


async def test_no_answer_in_time_is_unknown_outcome_after_one_request(subject: Subject) -> None:
    subject.script("device-silent", Answer.SILENT)
    push, ids = _push(subject, "device-silent")
    with pytest.raises(UnknownOutcomeError):
        await subject.provider.send(push, ids)
    assert subject.requests("device-silent") == 1
