"""Web Push through a real worker and the ledger, beside APNs and FCM, against the three fakes.

Every web request the fake push service reads has its VAPID JWT verified and its
body decrypted; each test ends with no refusal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import structlog

from consumers import App, CircuitState, DeadTarget, Settings, push_job_body
from dedupe import DbConnection
from providers import (
    ApnsProvider,
    FcmProvider,
    Notification,
    Platform,
    PlatformRouter,
    Provider,
    Push,
    Target,
    WebPushProvider,
    send_ids,
)
from providers.fakes import (
    FakeApns,
    FakeFcm,
    FakeWebPush,
    collapse_ids_sent,
    fakes_env,
    router_from_env,
)
from tests.apps.push_app import FAST_RETRY
from tests.harness import Harness
from tests.support import wait_for

IOS = Target(platform=Platform.IOS, token="ios-token-aaaaaaaaaaaa")
ANDROID = Target(platform=Platform.ANDROID, token="android-token-cccccccc")
LOCAL = frozenset({"127.0.0.1"})  # the fake push service's host, allowed for the test


@pytest.fixture
async def web_settings(harness: Harness) -> Settings:
    """The harness's settings with the fake's host allowed in push jobs."""
    return replace(
        harness.settings, worker=replace(harness.settings.worker, webpush_allow_hosts=LOCAL)
    )


@pytest.fixture
async def pruned(db: DbConnection) -> AsyncIterator[DbConnection]:
    await db.execute("CREATE TABLE pruned_devices (token text NOT NULL, reason text NOT NULL)")
    yield db


def push_app(
    queue: str,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush | None,
) -> App:
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return PlatformRouter(
            apns=ApnsProvider(fake_apns.settings(timeout_seconds=5.0)),
            fcm=FcmProvider(fake_fcm.settings(timeout_seconds=5.0)),
            webpush=None
            if fake_webpush is None
            else WebPushProvider(fake_webpush.settings(timeout_seconds=5.0)),
        )

    async def prune(tx: DbConnection, dead: DeadTarget) -> None:
        await tx.execute(
            "INSERT INTO pruned_devices (token, reason) VALUES ($1, $2)", dead.address, dead.reason
        )

    app.push_handler(
        queue, provider=provider, on_invalid_token=prune, lease_seconds=10.0, probe_seconds=0.5
    )
    return app


async def settled(db: DbConnection, n: int) -> bool:
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')")
    return bool(done >= n)


async def test_a_job_to_ios_android_and_web_reaches_each_once_and_a_redelivery_sends_none(
    harness: Harness,
    web_settings: Settings,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> None:
    browser = fake_webpush.subscribe("browser")
    body = push_job_body(
        targets=[IOS, ANDROID, browser.target],
        title="Shipped",
        body="Order 1042 is on its way",
        data={"order": "1042"},
        allow_hosts=LOCAL,
    )
    app = push_app(harness.queue, fake_apns, fake_fcm, fake_webpush)
    async with harness.run(app, web_settings):
        await harness.publish(body, message_id="order-1042-shipped")
        await harness.publish(body, message_id="order-1042-shipped")
        await wait_for(lambda: settled(pruned, 3))
        await harness.publish(body, message_id="order-1042-shipped")
        await harness.wait_outcome("duplicate_ignored", 2)

    assert len(fake_apns.requests_for(IOS.token)) == 1
    assert len(fake_fcm.requests_for(ANDROID.token)) == 1
    [web] = fake_webpush.requests_for(browser)
    assert web.payload["title"] == "Shipped" and web.payload["data"] == {"order": "1042"}
    assert fake_webpush.refusals == []
    rows = await pruned.fetch(
        "SELECT channel, address, status, provider_message_id, collapse_id FROM send_ledger"
        " ORDER BY target_index"
    )
    assert [(r["channel"], r["status"]) for r in rows] == [
        ("ios", "sent"),
        ("android", "sent"),
        ("webpush", "sent"),
    ]
    assert rows[2]["address"] == browser.endpoint
    assert rows[2]["provider_message_id"] == fake_webpush.pending(browser)[0].location
    # The job's collapse: APNs' collapse id is the dedupe key's readable hash; the
    # Topic is its own (32 URL-safe base64 characters), one per job.
    assert web.topic is not None and len(web.topic) == 32
    assert fake_apns.requests_for(IOS.token)[0].collapse_id == rows[0]["collapse_id"]


async def test_a_dead_web_subscription_runs_the_hook_with_its_endpoint_once(
    harness: Harness,
    web_settings: Settings,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> None:
    gone = fake_webpush.subscribe("gone")
    fake_webpush.unsubscribe("gone")
    body = push_job_body(targets=[gone.target], title="Hello", allow_hosts=LOCAL)
    async with harness.run(
        push_app(harness.queue, fake_apns, fake_fcm, fake_webpush), web_settings
    ):
        await harness.publish(body, message_id="to-a-gone-browser")
        await wait_for(lambda: settled(pruned, 1))
    hooks = await pruned.fetch("SELECT token, reason FROM pruned_devices")
    assert [(r["token"], r["reason"]) for r in hooks] == [(gone.endpoint, "SubscriptionGone")]
    assert await harness.dead_letters() == []


async def test_a_web_job_to_a_private_host_is_dead_lettered_saying_why(
    harness: Harness,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> None:
    """Without the allow-list (production), the worker refuses the fake's 127.0.0.1."""
    body = push_job_body(
        targets=[fake_webpush.subscribe("b").target], title="Hi", allow_hosts=LOCAL
    )
    async with harness.run(push_app(harness.queue, fake_apns, fake_fcm, fake_webpush)):
        await harness.publish(body, message_id="to-localhost")
        await harness.wait_dead_letters(1)
    [dead] = await harness.dead_letters()
    assert dead.headers["x-reason"] == "invalid_push_job"
    assert "targets[0].endpoint: a public host" in str(dead.headers["x-error"])
    assert fake_webpush.requests == []


async def test_without_a_webpush_provider_a_subscription_waits_and_the_rest_is_sent(
    harness: Harness,
    web_settings: Settings,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> None:
    """A router built as before Web Push: its circuit for "webpush" opens, naming the fix;
    the web target is neither sent nor failed, the iOS one is sent."""
    browser = fake_webpush.subscribe("browser")
    body = push_job_body(targets=[IOS, browser.target], title="Hi", allow_hosts=LOCAL)
    with structlog.testing.capture_logs() as logs:
        async with harness.run(
            push_app(harness.queue, fake_apns, fake_fcm, None), web_settings
        ) as worker:
            await harness.publish(body, message_id="web-not-configured")

            async def paused() -> bool:
                views = {v.provider: v for v in worker.provider_circuits()}
                view = views.get("webpush")
                return view is not None and view.state is not CircuitState.CLOSED

            await wait_for(paused)
            await wait_for(lambda: settled(pruned, 1))
    [line] = [e for e in logs if e["event"] == "provider_paused"]
    assert "WebPushNotConfigured" in line["reason"]
    statuses = await pruned.fetch("SELECT channel, status FROM send_ledger ORDER BY target_index")
    assert [(r["channel"], r["status"]) for r in statuses] == [
        ("ios", "sent"),
        ("webpush", "claimed"),
    ]
    assert len(fake_apns.requests_for(IOS.token)) == 1
    assert fake_webpush.requests == []


async def test_a_refused_vapid_key_pauses_web_push_alone(
    harness: Harness,
    web_settings: Settings,
    pruned: DbConnection,
    fake_apns: FakeApns,
    fake_fcm: FakeFcm,
    fake_webpush: FakeWebPush,
) -> None:
    """403 from the push service is our credentials: the "webpush" circuit opens, as
    APNs' 403 opens "apns"; nothing fails; once the key is taken, the push goes out."""
    browser = fake_webpush.subscribe("browser")
    fake_webpush.script("browser", status=403, times=1)
    body = push_job_body(targets=[browser.target, ANDROID], title="Hi", allow_hosts=LOCAL)
    with structlog.testing.capture_logs() as logs:
        async with harness.run(
            push_app(harness.queue, fake_apns, fake_fcm, fake_webpush), web_settings
        ):
            await harness.publish(body, message_id="vapid-refused")
            await wait_for(lambda: settled(pruned, 2), timeout=30)
    events = [e["event"] for e in logs]
    assert events.count("provider_paused") == 1 and events.count("provider_resumed") == 1
    assert [e["provider"] for e in logs if e["event"] == "provider_paused"] == ["webpush"]
    failed = await pruned.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'failed'")
    assert failed == 0
    assert len(fake_webpush.requests_for(browser)) == 2  # the refused one, then the probe
    assert len(fake_fcm.requests_for(ANDROID.token)) == 1


async def test_the_fakes_environment_reaches_the_fake_push_service(
    tmp_path: Path, fake_apns: FakeApns, fake_fcm: FakeFcm, fake_webpush: FakeWebPush
) -> None:
    """What the demo and chaos hand their worker processes: variables, read back."""
    env = fakes_env(fake_apns, fake_fcm, tmp_path, "T_", webpush=fake_webpush)
    assert Settings.from_env(env).worker.webpush_allow_hosts == LOCAL
    router = router_from_env(env, "T_", timeout_seconds=2.0)
    browser = fake_webpush.subscribe("browser")
    push = Push(target=browser.target, notification=Notification(title="Hi"))
    receipt = await router.send(push, send_ids("job", browser.endpoint))
    await router.aclose()
    assert receipt.provider == "webpush"
    assert collapse_ids_sent(fake_apns, fake_fcm, fake_webpush) == [
        (browser.endpoint, send_ids("job", browser.endpoint).webpush_topic)
    ]
    without = router_from_env(
        fakes_env(fake_apns, fake_fcm, tmp_path, "U_"), "U_", timeout_seconds=2.0
    )
    assert without.webpush.name == "webpush" and not isinstance(without.webpush, WebPushProvider)
    await without.aclose()
