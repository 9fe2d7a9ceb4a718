"""The send API's bodies as pydantic models: what FastAPI validates and /openapi.json shows.

`SendRequest` is the push job's shape, plus the optional `idempotency_key`;
strict, so `"3600"` is not a number and unknown fields are refused. The
send route also runs the worker's own rules on it
(`consumers.jobs.push.parse_push_job`, see `ingress.body`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from consumers.jobs.push import (
    HEADER_TEXT_PATTERN,
    MAX_AUDIENCE,
    MAX_TOKEN_CHARS,
    MAX_TTL_SECONDS,
    TOKEN_PATTERN,
)

MAX_KEY_BYTES = 128

_STRICT = ConfigDict(strict=True, extra="forbid")
Text = Annotated[str, Field(pattern="^[^\x00]*$")]  # PostgreSQL's text holds no NUL


class TargetIn(BaseModel):
    model_config = _STRICT
    platform: Literal["ios", "android", "web"]
    token: Annotated[
        str, Field(min_length=1, max_length=MAX_TOKEN_CHARS, pattern=f"^{TOKEN_PATTERN}$")
    ]


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
    idempotency_key: (
        Annotated[
            str,
            Field(
                min_length=1,
                max_length=MAX_KEY_BYTES,
                description="1 to 128 bytes of UTF-8, no NUL; or the Idempotency-Key header",
            ),
        ]
        | None
    ) = None


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
    platform: str | None = None
    provider_message_id: str | None = None
    failure_reason: str | None = None


class DevicesOut(BaseModel):
    """The send's devices by their ledger rows, every part counted."""

    sent: int
    failed: int
    pending: int


class MessageOut(BaseModel):
    id: str
    status: Literal["queued", "taken", "cancelled"]
    created_at: str
    updated_at: str
    devices: DevicesOut
    targets: list[TargetOut]  # one by one up to 1,000 devices; more: only `devices`


class Cancelled(BaseModel):
    id: str
    status: Literal["cancelled"]
