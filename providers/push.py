"""What to send and to whom: the values every provider takes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Platform(StrEnum):
    """Where the device is: iOS tokens go to APNs, Android tokens to FCM; a web target is
    a Web Push subscription (endpoint and keys: Web Push) or an FCM web token (FCM)."""

    IOS = "ios"
    ANDROID = "android"
    WEB = "web"


WEBPUSH_CHANNEL = "webpush"
"""A Web Push subscription's channel (its ledger rows', its router's): a web target with
a token alone is an FCM web token, channel `web`, as before subscriptions were taken."""


class Priority(StrEnum):
    """Delivery urgency: APNs apns-priority 10/5, FCM android priority high/normal."""

    HIGH = "high"
    NORMAL = "normal"


@dataclass(frozen=True, slots=True, kw_only=True)
class WebPushKeys:
    """A browser's Web Push subscription keys, base64url as `PushSubscription.toJSON()`
    gives them: `p256dh` (its P-256 public key, 65 bytes) and `auth` (16 bytes)."""

    p256dh: str
    auth: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """One device: its platform and its push token.

    A Web Push subscription is a web target whose `token` is the subscription's
    endpoint URL and whose `keys` are its encryption keys; a web target without
    keys is an FCM web registration token, sent through FCM as before.
    """

    platform: Platform
    token: str
    keys: WebPushKeys | None = None

    @property
    def is_webpush(self) -> bool:
        """A Web Push subscription (endpoint and keys), sent to its push service directly."""
        return self.keys is not None and self.platform is Platform.WEB

    @property
    def channel(self) -> str:
        """Which sender takes it: the platform, or `webpush` for a subscription."""
        return WEBPUSH_CHANNEL if self.is_webpush else str(self.platform)


@dataclass(frozen=True, slots=True, kw_only=True)
class Notification:
    """The visible alert (title, body) and the app's data; either may be empty."""

    title: str | None = None
    body: str | None = None
    data: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Push:
    """One notification to one target, with the delivery options of the job.

    `push_type` is APNs' apns-push-type ("alert", "background", ...); when None it is
    "alert" for a notification with a title or body, "background" otherwise.
    `collapse_key` is the job's own collapse key; it wins over the one derived from
    the dedupe key (see `send_ids`).
    """

    target: Target
    notification: Notification
    priority: Priority | None = None
    ttl_seconds: int | None = None
    push_type: str | None = None
    collapse_key: str | None = None

    @property
    def effective_push_type(self) -> str:
        if self.push_type is not None:
            return self.push_type
        if self.notification.title is not None or self.notification.body is not None:
            return "alert"
        return "background"
