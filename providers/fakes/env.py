"""The fakes together: handed to a worker process, and read after a run.

A test, the demo or the chaos run serves the fakes in its own process and
starts workers as child processes; `fakes_env` writes where the fakes listen
(and the APNs signing key, as a file) into variables under a prefix, and the
worker's provider factory calls `router_from_env` with the same prefix.
`collapse_ids_sent` reads back what the fakes were sent, for the checks
that count extra pushes and compare their collapse ids. The fake push service
(Web Push) is optional in each: without it, the router has no `webpush`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from providers.apns import ApnsProvider, ApnsSettings
from providers.fakes.apns import FakeApns
from providers.fakes.fcm import FakeFcm
from providers.fakes.webpush import FakeWebPush
from providers.fcm import FcmProvider, FcmSettings
from providers.routing import PlatformRouter
from providers.webpush import WebPushProvider


def fakes_env(
    apns: FakeApns,
    fcm: FakeFcm,
    key_dir: Path,
    prefix: str,
    webpush: FakeWebPush | None = None,
) -> dict[str, str]:
    """Variables `router_from_env(env, prefix)` reads to reach `apns`, `fcm` and `webpush`."""
    key = apns.settings().key
    assert key is not None
    key_file = key_dir / "apns-key.p8"
    key_file.write_text(key)
    web: dict[str, str] = {}
    if webpush is not None:
        vapid_file = key_dir / "vapid-key.pem"
        vapid_file.write_text(webpush.vapid_private_key)
        web = {
            f"{prefix}WEBPUSH_VAPID_KEY_FILE": str(vapid_file),
            f"{prefix}WEBPUSH_SUBJECT": webpush.subject,
            f"{prefix}WEBPUSH_CA_FILE": str(webpush.ca_file),
            # The worker's job parser allows the fake's host too (consumers Settings.from_env).
            "IW_WEBPUSH_ALLOW_HOSTS": "127.0.0.1",
        }
    return web | {
        f"{prefix}APNS_PORT": str(apns.port),
        f"{prefix}APNS_CA_FILE": str(apns.ca_file),
        f"{prefix}APNS_KEY_FILE": str(key_file),
        f"{prefix}FCM_BASE_URL": fcm.base_url,
        f"{prefix}FCM_SERVICE_ACCOUNT": str(fcm.service_account_file),
        f"{prefix}FCM_PROJECT": fcm.project_id,
    }


def router_from_env(
    env: Mapping[str, str], prefix: str, *, timeout_seconds: float
) -> PlatformRouter:
    """APNs and FCM providers pointed at the fakes `fakes_env` described.

    Call it inside the running event loop (aioapns needs one).
    """
    webpush = None
    if f"{prefix}WEBPUSH_VAPID_KEY_FILE" in env:
        webpush = WebPushProvider(
            FakeWebPush.sender_settings(
                vapid_private_key=Path(env[f"{prefix}WEBPUSH_VAPID_KEY_FILE"]).read_text(),
                subject=env[f"{prefix}WEBPUSH_SUBJECT"],
                ca_file=env[f"{prefix}WEBPUSH_CA_FILE"],
                timeout_seconds=timeout_seconds,
                connect_timeout_seconds=min(3.0, timeout_seconds),
            )
        )
    return PlatformRouter(
        webpush=webpush,
        apns=ApnsProvider(
            ApnsSettings(
                topic="com.example.app",
                key=Path(env[f"{prefix}APNS_KEY_FILE"]).read_text(),
                key_id="FAKEKEY123",
                team_id="FAKETEAM12",
                host="127.0.0.1",
                port=int(env[f"{prefix}APNS_PORT"]),
                ca_file=env[f"{prefix}APNS_CA_FILE"],
                timeout_seconds=timeout_seconds,
            )
        ),
        fcm=FcmProvider(
            FcmSettings(
                credentials=env[f"{prefix}FCM_SERVICE_ACCOUNT"],
                project_id=env[f"{prefix}FCM_PROJECT"],
                base_url=env[f"{prefix}FCM_BASE_URL"],
                timeout_seconds=timeout_seconds,
                # Local fakes connect at once; a send must start with connect + read
                # timeouts before its lease's deadline, so keep the first small.
                connect_timeout_seconds=min(3.0, timeout_seconds),
            )
        ),
    )


def collapse_ids_sent(
    apns: FakeApns, fcm: FakeFcm, webpush: FakeWebPush | None = None
) -> list[tuple[str, str]]:
    """(device token, collapse id) of every request the fakes read, each fake's in order.

    For FCM, the Android collapse key, else the webpush Topic ("" when none); for
    Web Push, (the subscription's endpoint, its Topic).
    """
    sent = [(r.token, r.collapse_id or "") for r in apns.requests]
    sent += [(r.token, r.collapse_key or r.topic or "") for r in fcm.requests]
    if webpush is not None:
        sent += [(r.endpoint, r.topic or "") for r in webpush.requests]
    return sent
