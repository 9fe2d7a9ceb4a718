"""WebPushProvider through pywebpush and httpx against the fake push service.

Every request the fake reads has its VAPID JWT verified (with PyJWT) and its body
decrypted with the subscription's private key; `no_refusals` checks that none
was refused. One test per row of the error taxonomy (`providers.webpush_wire`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator

import pytest

from providers import (
    InvalidDeviceToken,
    Notification,
    NotStartedInTime,
    PermanentProviderError,
    Platform,
    PlatformRouter,
    Priority,
    ProviderConfigurationError,
    ProviderReceipt,
    Push,
    RecordingProvider,
    Target,
    TransientProviderError,
    UnknownOutcomeError,
    WebPushProvider,
    send_ids,
)
from providers.fakes import FakeSubscription, FakeWebPush
from providers.webpush import REFRESH_SECONDS, TOKEN_SECONDS, VapidTokens
from providers.webpush_wire import MAX_ENCRYPTED_BYTES, MAX_PLAIN_BYTES

TIMEOUT_S = 0.5
JOB = "shipments\0acme\0order-1042-shipped"


@pytest.fixture
async def webpush(fake_webpush: FakeWebPush) -> AsyncIterator[WebPushProvider]:
    provider = WebPushProvider(fake_webpush.settings(timeout_seconds=TIMEOUT_S))
    yield provider
    await provider.aclose()


@pytest.fixture
def browser(fake_webpush: FakeWebPush) -> FakeSubscription:
    return fake_webpush.subscribe("browser")


def shipped(target: Target, **options: object) -> Push:
    note = Notification(title="Shipped", body="Order 1042", data={"order": "1042"})
    return Push(target=target, notification=note, **options)  # type: ignore[arg-type]


async def send(provider: WebPushProvider, push: Push, job: str = JOB) -> ProviderReceipt:
    return await provider.send(push, send_ids(job, push.target.token))


# --- 201: sent ----------------------------------------------------------------


async def test_201_is_sent_its_location_is_the_message_id_and_the_browser_reads_the_text(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    push = shipped(browser.target, priority=Priority.HIGH, ttl_seconds=600)
    receipt = await send(webpush, push)

    [request] = fake_webpush.requests_for(browser)
    assert receipt == ProviderReceipt(
        provider="webpush", provider_message_id=fake_webpush.pending(browser)[0].location
    )
    assert receipt.provider_message_id.startswith(f"{fake_webpush.origin}/m/")
    ids = send_ids(JOB, browser.endpoint)
    assert request.payload == {
        "title": "Shipped",
        "body": "Order 1042",
        "data": {"order": "1042"},
        "tag": ids.webpush_topic,
    }
    assert (request.topic, request.ttl, request.urgency) == (ids.webpush_topic, 600, "high")
    assert request.headers["Content-Encoding"] == "aes128gcm"
    assert request.claims["aud"] == fake_webpush.origin
    assert request.claims["sub"] == "mailto:push@example.com"
    assert time.time() < request.claims["exp"] <= time.time() + 24 * 3600
    assert request.vapid_key == webpush.application_server_key
    assert fake_webpush.refusals == []


async def test_a_push_without_ttl_or_priority_gets_the_default_ttl_and_no_urgency(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    await send(webpush, shipped(browser.target))
    [request] = fake_webpush.requests_for(browser)
    assert (request.ttl, request.urgency) == (webpush.settings.default_ttl_seconds, None)
    assert request.payload["title"] == "Shipped"


# --- 404 and 410: a dead subscription ---------------------------------------------


async def test_404_is_a_dead_subscription(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", status=404)
    with pytest.raises(InvalidDeviceToken) as raised:
        await send(webpush, shipped(browser.target))
    assert (raised.value.status, raised.value.reason) == (404, "SubscriptionNotFound")
    assert len(fake_webpush.requests_for(browser)) == 1


async def test_410_from_an_unsubscribed_browser_is_a_dead_subscription(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.unsubscribe("browser")  # the push service itself answers 410 Gone
    with pytest.raises(InvalidDeviceToken) as raised:
        await send(webpush, shipped(browser.target))
    assert (raised.value.status, raised.value.reason) == (410, "SubscriptionGone")


# --- 413: permanent -----------------------------------------------------------


async def test_413_is_permanent(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", status=413)
    with pytest.raises(PermanentProviderError) as raised:
        await send(webpush, shipped(browser.target))
    assert not isinstance(raised.value, InvalidDeviceToken)
    assert (raised.value.status, raised.value.reason) == (413, "PayloadTooLarge")


async def test_a_payload_over_4096_bytes_encrypted_is_refused_without_a_request(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    overhead = len(b'{"body":"","tag":"' + send_ids(JOB, "").webpush_topic.encode() + b'"}')
    fits = Push(
        target=browser.target, notification=Notification(body="x" * (MAX_PLAIN_BYTES - overhead))
    )
    too_big = Push(
        target=browser.target,
        notification=Notification(body="x" * (MAX_PLAIN_BYTES - overhead + 1)),
    )

    await send(webpush, fits)
    assert fake_webpush.requests_for(browser)[0].encrypted_bytes == MAX_ENCRYPTED_BYTES
    with pytest.raises(PermanentProviderError, match="PayloadTooLarge"):
        await send(webpush, too_big)
    assert len(fake_webpush.requests_for(browser)) == 1


# --- 429 and 5xx: transient -------------------------------------------------------


async def test_429_is_transient_with_its_retry_after(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", status=429, retry_after=30)
    with pytest.raises(TransientProviderError) as raised:
        await send(webpush, shipped(browser.target))
    assert not isinstance(raised.value, ProviderConfigurationError)
    assert (raised.value.status, raised.value.retry_after) == (429, 30)


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_5xx_is_transient(
    status: int, webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", status=status, retry_after=5)
    with pytest.raises(TransientProviderError) as raised:
        await send(webpush, shipped(browser.target))
    assert not isinstance(raised.value, ProviderConfigurationError)
    assert (raised.value.status, raised.value.retry_after) == (status, 5)
    assert len(fake_webpush.requests_for(browser)) == 1  # not retried inside


# --- 400 and 403: our credentials -------------------------------------------------


async def test_403_for_a_vapid_key_the_subscription_was_not_made_for_is_configuration(
    webpush: WebPushProvider, fake_webpush: FakeWebPush
) -> None:
    other_key = WebPushProvider(fake_webpush.settings(vapid_private_key=_another_key()))
    stranger = fake_webpush.subscribe(
        "stranger", application_server_key=other_key.application_server_key
    )
    await other_key.aclose()
    with pytest.raises(ProviderConfigurationError) as raised:
        await send(webpush, shipped(stranger.target))
    assert raised.value.status == 403
    assert fake_webpush.refusals == ["403 vapid: not the key this subscription was made for"]


async def test_400_is_configuration(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", status=400)
    with pytest.raises(ProviderConfigurationError) as raised:
        await send(webpush, shipped(browser.target))
    assert raised.value.status == 400


async def test_401_is_configuration(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", status=401)
    with pytest.raises(ProviderConfigurationError):
        await send(webpush, shipped(browser.target))


# --- the connection -----------------------------------------------------------------


async def test_a_connection_refused_before_the_request_is_transient(
    fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    provider = WebPushProvider(fake_webpush.settings(timeout_seconds=TIMEOUT_S))
    nowhere = Target(
        platform=Platform.WEB,
        token=browser.endpoint.replace(f":{fake_webpush.port}/", f":{port}/"),
        keys=browser.keys,
    )
    with pytest.raises(TransientProviderError) as raised:
        await send(provider, shipped(nowhere))
    await provider.aclose()
    assert type(raised.value) is TransientProviderError
    assert raised.value.reason == "ConnectFailed"


async def test_the_push_services_certificate_is_verified_not_trusted_blindly(
    fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    provider = WebPushProvider(fake_webpush.settings(ca_file=None))  # the system's CAs only
    with pytest.raises(TransientProviderError, match="ConnectFailed"):
        await send(provider, shipped(browser.target))
    await provider.aclose()
    assert fake_webpush.requests == []


async def test_no_answer_in_time_is_an_unknown_outcome(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", latency=TIMEOUT_S * 4)
    started = time.monotonic()
    with pytest.raises(UnknownOutcomeError, match="Timeout"):
        await send(webpush, shipped(browser.target))
    assert time.monotonic() - started < TIMEOUT_S * 3
    assert len(fake_webpush.requests_for(browser)) == 1


async def test_a_connection_lost_after_the_request_is_an_unknown_outcome(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    fake_webpush.script("browser", drop=True, times=1)
    with pytest.raises(UnknownOutcomeError, match="ConnectionLost"):
        await send(webpush, shipped(browser.target))
    await send(webpush, shipped(browser.target))  # a new connection, no resend of the first
    assert len(fake_webpush.requests_for(browser)) == 2


async def test_a_send_that_cannot_start_before_its_deadline_is_not_made(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    push = shipped(browser.target)
    soon = time.monotonic() + TIMEOUT_S  # less than the read timeout and a connect
    with pytest.raises(NotStartedInTime):
        await webpush.send(push, send_ids(JOB, browser.endpoint), deadline=soon)
    assert fake_webpush.requests == []


# --- what is refused before any request ------------------------------------------------


async def test_a_private_host_is_refused_without_the_allow_list(
    fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    provider = WebPushProvider(fake_webpush.settings(allow_hosts=frozenset()))
    with pytest.raises(InvalidDeviceToken, match="private, loopback or reserved"):
        await send(provider, shipped(browser.target))
    await provider.aclose()
    assert fake_webpush.requests == []


async def test_a_target_that_is_not_a_subscription_is_refused(webpush: WebPushProvider) -> None:
    with pytest.raises(PermanentProviderError, match="NotAWebPushSubscription"):
        await send(webpush, shipped(Target(platform=Platform.WEB, token="fcm-web-token")))


def test_a_bad_vapid_key_or_subject_is_refused_at_start(fake_webpush: FakeWebPush) -> None:
    with pytest.raises(ValueError, match="vapid_private_key"):
        WebPushProvider(fake_webpush.settings(vapid_private_key="not a key"))
    with pytest.raises(ValueError, match="VAPID claims refused"):
        WebPushProvider(fake_webpush.settings(subject="push team"))


# --- Topic: the collapse key ---------------------------------------------------------


async def test_a_pending_message_is_replaced_by_one_with_the_same_topic(
    webpush: WebPushProvider, fake_webpush: FakeWebPush, browser: FakeSubscription
) -> None:
    await send(webpush, shipped(browser.target))
    resent = await send(webpush, shipped(browser.target))  # a resend: the same ids
    other = await send(webpush, shipped(browser.target), job="order-1043-shipped")

    pending = fake_webpush.pending(browser)
    assert [m.location for m in pending] == [
        resent.provider_message_id,
        other.provider_message_id,
    ]
    assert len(fake_webpush.requests_for(browser)) == 3
    assert [m.topic for m in fake_webpush.deliver(browser)] == [
        send_ids(JOB, browser.endpoint).webpush_topic,
        "order-1043-shipped",
    ]
    assert fake_webpush.pending(browser) == []


# --- VAPID: one JWT per audience -------------------------------------------------------


async def test_one_vapid_jwt_is_signed_per_push_service_and_reused(
    webpush: WebPushProvider, fake_webpush: FakeWebPush
) -> None:
    signed_before = webpush.vapid.signed
    browsers = [fake_webpush.subscribe(f"b{n}") for n in range(5)]
    for b in browsers:
        await send(webpush, shipped(b.target))
    assert webpush.vapid.signed == signed_before + 1
    assert len({r.vapid_token for r in fake_webpush.requests}) == 1
    assert fake_webpush.refusals == []


def test_a_vapid_jwt_is_signed_anew_before_its_expiry() -> None:
    now = [1_000_000.0]
    signer = _CountingSigner()
    tokens = VapidTokens(signer, subject="mailto:a@example.com", clock=lambda: now[0])
    first = tokens.header("https://push.example.net")
    now[0] += TOKEN_SECONDS - REFRESH_SECONDS - 1
    assert tokens.header("https://push.example.net") == first
    now[0] += 1
    assert tokens.header("https://push.example.net") != first
    assert tokens.header("https://other.example.net") != first
    assert [c["aud"] for c in signer.claims] == [
        "https://push.example.net",
        "https://push.example.net",
        "https://other.example.net",
    ]
    assert all(int(str(c["exp"])) - now[0] <= TOKEN_SECONDS for c in signer.claims)


class _CountingSigner:
    def __init__(self) -> None:
        self.claims: list[dict[str, object]] = []

    def sign(self, claims: dict[str, object]) -> dict[str, str]:
        self.claims.append(dict(claims))
        return {"Authorization": f"vapid t=token-{len(self.claims)}, k=key"}


def _another_key() -> str:
    from providers.fakes.tls import make_apns_signing_key

    return make_apns_signing_key()


# --- routing ---------------------------------------------------------------------------


async def test_the_router_sends_subscriptions_to_webpush_and_fcm_web_tokens_to_fcm(
    browser: FakeSubscription,
) -> None:
    apns, fcm, web = RecordingProvider("apns"), RecordingProvider("fcm"), RecordingProvider("wp")
    router = PlatformRouter(apns=apns, fcm=fcm, webpush=web)
    fcm_web_token = Target(platform=Platform.WEB, token="fcm-web-token")
    for target in (browser.target, fcm_web_token, Target(platform=Platform.IOS, token="i")):
        await send_to(router, shipped(target))
    assert [s.push.target for s in web.sends] == [browser.target]
    assert [s.push.target for s in fcm.sends] == [fcm_web_token]
    assert len(apns.sends) == 1
    assert (browser.target.channel, fcm_web_token.channel) == ("webpush", "web")
    assert router.provider_for("webpush") is web and router.provider_for("web") is fcm


async def test_a_router_without_webpush_refuses_subscriptions_as_configuration(
    browser: FakeSubscription,
) -> None:
    router = PlatformRouter(apns=RecordingProvider("apns"), fcm=RecordingProvider("fcm"))
    with pytest.raises(ProviderConfigurationError, match="WebPushNotConfigured") as raised:
        await send_to(router, shipped(browser.target))
    assert raised.value.provider == "webpush"
    await send_to(router, shipped(Target(platform=Platform.WEB, token="fcm-web-token")))


async def send_to(router: PlatformRouter, push: Push) -> ProviderReceipt:
    return await router.send(push, send_ids(JOB, push.target.token))
