"""External senders: the Sender seam (and Provider, its push form), what a channel offers
after a crash (Recovery), APNs, FCM, Web Push, webhooks, e-mail over SMTP and any HTTP
API with an idempotency key, their errors, and stable send ids.

`providers.fakes` holds local fake APNs, FCM, Web Push and SMTP servers, a webhook
receiver and a payments API for tests and demos. The APNs, FCM, Web Push, webhook, SMTP
and API senders load on first use, so the rest (the values, the subscription check)
works without their extras (`push`, `webhooks`, `mail`, `api`).
"""

from typing import TYPE_CHECKING, Any

from providers.api_call import ApiCall, ApiRequest, ApiResponse, ApiSettings, InvalidCall
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
from providers.mail import Email, InvalidEmail
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
from providers.smtp_settings import SmtpSettings, SmtpTls
from providers.webhook_call import WebhookCall, webhook_id
from providers.webpush_subscription import SubscriptionProblem, subscription_problem

if TYPE_CHECKING:
    from providers.apns import ApnsProvider, ApnsSettings
    from providers.fcm import FcmProvider, FcmSettings
    from providers.idempotent_api import IdempotentApi
    from providers.smtp import SmtpSender
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
    "IdempotentApi": "providers.idempotent_api",
    "SmtpSender": "providers.smtp",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'providers' has no attribute {name!r}")


__all__ = [
    "LOOKUP_BY_KEY",
    "NEITHER",
    "ApiCall",
    "ApiRequest",
    "ApiResponse",
    "ApiSettings",
    "ApnsProvider",
    "ApnsSettings",
    "Email",
    "FcmProvider",
    "FcmSettings",
    "IdempotentApi",
    "InvalidCall",
    "InvalidDeviceToken",
    "InvalidEmail",
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
    "SmtpSender",
    "SmtpSettings",
    "SmtpTls",
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
