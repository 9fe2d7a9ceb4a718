"""External senders: the Sender seam (and Provider, its push form), what a channel offers
after a crash (Recovery), APNs, FCM, Web Push and webhooks, their errors, and stable
send ids.

`providers.fakes` holds local fake APNs, FCM and Web Push servers and a webhook receiver
for tests and demos. The APNs, FCM, Web Push and webhook senders load on first use, so
the rest (the values, the subscription check) works without the `push` or `webhooks` extra.
"""

from typing import TYPE_CHECKING, Any

from providers.errors import (
    InvalidDeviceToken,
    NotStartedInTime,
    PermanentProviderError,
    ProviderConfigurationError,
    ProviderError,
    TargetGone,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.ids import JobIds, SendIds, job_ids, send_ids
from providers.provider import (
    LOOKUP_BY_KEY,
    NEITHER,
    LooksUp,
    Provider,
    ProviderReceipt,
    Recovery,
    RecoveryKind,
    Sender,
    replays_within,
)
from providers.push import Notification, Platform, Priority, Push, Target, WebPushKeys
from providers.recording import RecordedSend, RecordingProvider
from providers.routing import PlatformRouter
from providers.webhook_call import WebhookCall, webhook_id
from providers.webpush_subscription import SubscriptionProblem, subscription_problem

if TYPE_CHECKING:
    from providers.apns import ApnsProvider, ApnsSettings
    from providers.fcm import FcmProvider, FcmSettings
    from providers.webhooks import WebhookSender
    from providers.webpush import WebPushProvider, WebPushSettings

_LAZY = {
    "ApnsProvider": "providers.apns",
    "ApnsSettings": "providers.apns",
    "FcmProvider": "providers.fcm",
    "FcmSettings": "providers.fcm",
    "WebPushProvider": "providers.webpush",
    "WebPushSettings": "providers.webpush",
    "WebhookSender": "providers.webhooks",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'providers' has no attribute {name!r}")


__all__ = [
    "LOOKUP_BY_KEY",
    "NEITHER",
    "ApnsProvider",
    "ApnsSettings",
    "FcmProvider",
    "FcmSettings",
    "InvalidDeviceToken",
    "JobIds",
    "LooksUp",
    "NotStartedInTime",
    "Notification",
    "PermanentProviderError",
    "Platform",
    "PlatformRouter",
    "Priority",
    "Provider",
    "ProviderConfigurationError",
    "ProviderError",
    "ProviderReceipt",
    "Push",
    "RecordedSend",
    "RecordingProvider",
    "Recovery",
    "RecoveryKind",
    "SendIds",
    "Sender",
    "SubscriptionProblem",
    "Target",
    "TargetGone",
    "TransientProviderError",
    "UnknownOutcomeError",
    "WebPushKeys",
    "WebPushProvider",
    "WebPushSettings",
    "WebhookCall",
    "WebhookSender",
    "job_ids",
    "replays_within",
    "send_ids",
    "subscription_problem",
    "webhook_id",
]
