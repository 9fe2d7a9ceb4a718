"""The webhook routes' bodies as pydantic models: what /openapi.json shows, and the shape
checked before the worker's own rules (`consumers.jobs.webhook.parse_webhook_job`).

`WebhookRequest` is the webhook job's format plus the optional `idempotency_key`;
strict, so unknown fields are refused (the worker would ignore a misspelt
`endpoint` and send to every endpoint). Endpoints (`EndpointIn`, `EndpointOut`)
are the tenant's of the API key: the tenant is never a field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from consumers.jobs.webhook import (
    ENDPOINT_ID_PATTERN,
    EVENT_TYPE_PATTERN,
    MAX_ENDPOINTS,
    MAX_EVENT_TYPE_CHARS,
)
from consumers.jobs.webhook_endpoints import MAX_URL_CHARS
from ingress.models import IdempotencyKey

_STRICT = ConfigDict(strict=True, extra="forbid")
MAX_EVENT_TYPES = 100  # of one endpoint
# What /openapi.json says a URL looks like: an https URL with a host, no user, password
# or fragment. The rule itself is `url_problem`'s, which also takes http to the hosts
# of IW_WEBHOOK_ALLOW_HTTP_HOSTS; the model refuses only a NUL before it.
URL_SHAPE = (
    r"^https://([^\x00-\x20/?#@\[\]:]+|\[[0-9A-Fa-f:]+\])(:[0-9]{1,4})?([/?][^\x00-\x20#]*)?$"
)

EventType = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_EVENT_TYPE_CHARS,
        pattern=f"^{EVENT_TYPE_PATTERN}$",
        description="dot-separated names of letters, digits, _ and -",
    ),
]
EndpointId = Annotated[str, Field(pattern=f"^{ENDPOINT_ID_PATTERN}$")]


class WebhookRequest(BaseModel):
    """A webhook job (the webhook worker's format) and, unless given as a header, its key."""

    model_config = _STRICT
    event_type: EventType
    payload: Any = Field(description="any JSON: the event's data, sent as `data`")
    timestamp: Annotated[str, Field(json_schema_extra={"format": "date-time"})] | None = Field(
        default=None,
        description="ISO 8601 date and time of the event; absent: when the send API took it",
    )
    # fail_fast: the first wrong id is the 400's, not each of them.
    endpoints: (
        Annotated[
            list[EndpointId],
            Field(
                min_length=1,
                max_length=MAX_ENDPOINTS,
                fail_fast=True,
                description="only these of your endpoints, whatever event types they take;"
                " absent: every enabled endpoint of yours that takes `event_type`",
            ),
        ]
        | None
    ) = None
    idempotency_key: IdempotencyKey | None = None


class EndpointIn(BaseModel):
    model_config = _STRICT
    url: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_URL_CHARS,
            pattern="^[^\x00]*$",
            description="https (http only to IW_WEBHOOK_ALLOW_HTTP_HOSTS); no user,"
            " password or fragment; redirects are not followed",
            json_schema_extra={"pattern": URL_SHAPE},
        ),
    ]
    event_types: Annotated[
        list[EventType],
        Field(max_length=MAX_EVENT_TYPES, description="the event types it takes; none: every one"),
    ] = Field(default_factory=list)


class RotateIn(BaseModel):
    model_config = _STRICT
    overlap_hours: Annotated[float, Field(ge=0, le=24 * 365)] | None = Field(
        default=None,
        description="how long the previous secrets still sign beside the new one"
        " (default IW_WEBHOOK_ROTATION_OVERLAP_HOURS, 24); 0: the new one alone from now",
    )


class SecretOut(BaseModel):
    prefix: str = Field(description="its first characters and an ellipsis: never the secret")
    created_at: datetime
    expires_at: datetime | None = Field(description="null: current")


class EndpointOut(BaseModel):
    id: str
    url: str
    event_types: list[str]
    state: Literal["enabled", "disabled"]
    disabled_reason: str | None
    created_at: datetime
    secrets: list[SecretOut] = Field(description="the live ones, newest first")


class EndpointMade(EndpointOut):
    secret: str = Field(description="the signing secret, shown this once: give it to the receiver")


class EndpointList(BaseModel):
    endpoints: list[EndpointOut]


class Rotated(BaseModel):
    id: str
    secret: str = Field(description="the new signing secret, shown this once")
    secrets: list[SecretOut] = Field(description="the live ones now, newest first")


class NotServed(BaseModel):
    error: Literal["kind_not_served", "webhook_secrets_key_missing"]
    message: str
