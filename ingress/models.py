"""The send API's bodies as pydantic models: what FastAPI validates and /openapi.json shows.

`SendRequest` is the push job's shape, plus the optional `idempotency_key`;
strict, so `"3600"` is not a number and unknown fields are refused. The
send route also runs the worker's own rules on it
(`consumers.jobs.push.parse_push_job`, see `ingress.body`).

A target has one of two shapes: a device token (`TokenTarget`), or a browser's
Web Push subscription (`SubscriptionTarget`, platform `web`, as
`PushSubscription.toJSON()` gives it). A target with `endpoint` or `keys` is
read as a subscription, any other as a token; a 400 names the field either way
(`targets.0.keys.p256dh`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from consumers.jobs.push import (
    HEADER_TEXT_PATTERN,
    MAX_AUDIENCE,
    MAX_TOKEN_CHARS,
    MAX_TTL_SECONDS,
    TOKEN_PATTERN,
)
from providers.webpush_subscription import MAX_ENDPOINT_CHARS

MAX_KEY_BYTES = 128

_STRICT = ConfigDict(strict=True, extra="forbid")
Text = Annotated[str, Field(pattern="^[^\x00]*$")]  # PostgreSQL's text holds no NUL
IdempotencyKey = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_KEY_BYTES,
        description="1 to 128 bytes of UTF-8, no NUL; or the Idempotency-Key header",
    ),
]


_KEY_TEXT = "^[A-Za-z0-9_-]+={0,2}$"  # base64url, padded or not


class TokenTarget(BaseModel):
    """A device by its token: APNs's, FCM's (a `web` token is an FCM web registration token)."""

    model_config = _STRICT
    platform: Literal["ios", "android", "web"]
    token: Annotated[
        str, Field(min_length=1, max_length=MAX_TOKEN_CHARS, pattern=f"^{TOKEN_PATTERN}$")
    ]


class SubscriptionKeys(BaseModel):
    model_config = _STRICT
    p256dh: Annotated[
        str,
        Field(
            min_length=86,
            max_length=88,
            pattern=_KEY_TEXT,
            description="base64url of the subscription's P-256 public key (65 bytes)",
        ),
    ]
    auth: Annotated[
        str,
        Field(
            min_length=22,
            max_length=24,
            pattern=_KEY_TEXT,
            description="base64url of the subscription's 16-byte auth secret",
        ),
    ]


class SubscriptionTarget(BaseModel):
    """A browser's Web Push subscription: `PushSubscription.toJSON()` and `platform: web`.

    The endpoint is https, with a public host (unless IW_WEBPUSH_ALLOW_HOSTS names
    it), no user, password or fragment; the payload must fit 4,096 bytes encrypted."""

    model_config = _STRICT
    platform: Literal["web"]
    endpoint: Annotated[str, Field(min_length=1, max_length=MAX_ENDPOINT_CHARS)]
    keys: SubscriptionKeys
    expirationTime: int | None = Field(  # the browser's own name
        default=None, description="as the browser gives it (ms since the epoch); not used"
    )


TARGET_SHAPES = ("token", "subscription")  # the tags pydantic puts in an error's location


def _shape(target: Any) -> str:
    is_subscription = isinstance(target, dict) and ("endpoint" in target or "keys" in target)
    return "subscription" if is_subscription else "token"


TargetIn = Annotated[
    Annotated[TokenTarget, Tag("token")] | Annotated[SubscriptionTarget, Tag("subscription")],
    Discriminator(_shape),
]
TARGET_FIELDS = frozenset(TokenTarget.model_fields) | frozenset(SubscriptionTarget.model_fields)


class NotificationIn(BaseModel):
    model_config = _STRICT
    title: Text | None = None
    body: Text | None = None
    data: dict[Text, Text] = Field(default_factory=dict)


class SendRequest(BaseModel):
    """A push job (the push worker's format) and, unless given as a header, its key."""

    model_config = _STRICT
    # More than one job holds: sent as parts (consumers.publishing.parts), counted together.
    # fail_fast: the first wrong target is the 400's, not each of up to MAX_AUDIENCE.
    targets: Annotated[list[TargetIn], Field(min_length=1, max_length=MAX_AUDIENCE, fail_fast=True)]
    notification: NotificationIn = Field(default_factory=NotificationIn)
    priority: Literal["high", "normal"] | None = None
    ttl_seconds: Annotated[int, Field(ge=0, le=MAX_TTL_SECONDS)] | None = None
    push_type: Annotated[str, Field(pattern=f"^{HEADER_TEXT_PATTERN}$")] | None = None
    collapse_key: Annotated[str, Field(min_length=1, pattern="^[^\x00]*$")] | None = None
    idempotency_key: IdempotencyKey | None = None


class Queued(BaseModel):
    status: Literal["queued", "duplicate_ignored"]
    id: str


class Detail(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str


class InvalidRequest(BaseModel):
    error: Literal["invalid_request"]
    details: list[Detail]


class NotCancellable(BaseModel):
    error: Literal["message_not_cancellable"]
    status: str


class TargetOut(BaseModel):
    index: int
    status: Literal["pending", "claimed", "sending", "sent", "failed"]
    platform: str | None = Field(
        default=None, description="the channel: ios, android, web, webpush, webhook, email"
    )
    address: str | None = Field(
        default=None,
        description="whom it went to: a webhook endpoint's id, or the start of a device"
        " token or subscription endpoint",
    )
    provider_message_id: str | None = None
    failure_reason: str | None = None


class DevicesOut(BaseModel):
    """The send's targets (devices, endpoints, addresses) by their ledger rows, every
    part counted."""

    sent: int
    failed: int
    pending: int


class MessageOut(BaseModel):
    id: str
    status: Literal["queued", "taken", "cancelled"]
    created_at: str
    updated_at: str
    devices: DevicesOut
    # One by one up to 1,000 devices; more: only `devices`. A webhook's endpoints are
    # chosen by the worker: listed once it has taken the job.
    targets: list[TargetOut]


class Cancelled(BaseModel):
    id: str
    status: Literal["cancelled"]
