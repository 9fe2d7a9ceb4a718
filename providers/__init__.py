"""External senders: the Sender seam (and Provider, its push form), what a channel offers
after a crash (Recovery), APNs and FCM, e-mail over SMTP, any API with an idempotency
key, their errors, and stable send ids.

`providers.fakes` holds local fake servers for tests and demos.
The APNs, FCM, SMTP and API senders load on first use, so the rest works without
their extras (`push`, `mail`, `api`).
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
from providers.push import Notification, Platform, Priority, Push, Target
from providers.recording import RecordedSend, RecordingProvider
from providers.routing import PlatformRouter
from providers.smtp_settings import SmtpSettings, SmtpTls

if TYPE_CHECKING:
    from providers.apns import ApnsProvider, ApnsSettings
    from providers.fcm import FcmProvider, FcmSettings
    from providers.idempotent_api import IdempotentApi
    from providers.smtp import SmtpSender

_LAZY = {
    "ApnsProvider": "providers.apns",
    "ApnsSettings": "providers.apns",
    "FcmProvider": "providers.fcm",
    "FcmSettings": "providers.fcm",
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
    "Target",
    "TargetGone",
    "TransientProviderError",
    "UnknownOutcomeError",
    "job_ids",
    "replays_within",
    "send_ids",
]
