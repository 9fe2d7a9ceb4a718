"""The e-mail route's body as a pydantic model: what /openapi.json shows, and the shape
checked before the worker's own rules (`consumers.jobs.email.parse_email_job`).

`EmailRequest` is the e-mail job's format plus the optional `idempotency_key`;
strict, so unknown fields are refused. `from` is a Python keyword: the field is
`sender`, named `from` in JSON. What an address, a mailbox and a header may be is
the worker's parser's to decide (`providers.mail`); the patterns here are what
/openapi.json says they look like (a generator of requests draws from them).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from consumers.jobs.email import MAX_RECIPIENTS, MAX_SUBJECT_CHARS
from ingress.models import IdempotencyKey

_ADDRESS = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+"
ADDRESS_SHAPE = f"^{_ADDRESS}$"
MAILBOX_SHAPE = f"^({_ADDRESS}|[A-Za-z0-9]+( [A-Za-z0-9]+)* <{_ADDRESS}>)$"
LINE_SHAPE = "^[^\r\n\x00]*$"  # no CR, LF or NUL
Address = Annotated[str, Field(json_schema_extra={"pattern": ADDRESS_SHAPE})]
Mailbox = Annotated[str, Field(json_schema_extra={"pattern": MAILBOX_SHAPE})]


class EmailRequest(BaseModel):
    """An e-mail job (the e-mail worker's format) and, unless given as a header, its key."""

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        json_schema_extra={"anyOf": [{"required": ["text"]}, {"required": ["html"]}]},
    )
    # fail_fast: the first wrong address is the 400's, not each of them.
    to: Annotated[
        list[Address],
        Field(
            min_length=1,
            max_length=MAX_RECIPIENTS,
            fail_fast=True,
            description="e-mail addresses (ASCII; an internationalized domain as xn--);"
            " each gets a message of its own",
        ),
    ]
    subject: Annotated[
        str,
        Field(
            max_length=MAX_SUBJECT_CHARS,
            description="one line",
            json_schema_extra={"pattern": LINE_SHAPE},
        ),
    ]
    text: str | None = Field(default=None, description="text or html: at least one")
    html: str | None = None
    sender: Mailbox | None = Field(
        default=None,
        alias="from",
        description="a mailbox (`Shop <shop@example.com>`); absent: the worker's default_from",
    )
    reply_to: Mailbox | None = None
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="extra headers: printable names, one-line values; not the message's own"
        " (From, To, Subject, Message-ID, ...)",
        json_schema_extra={
            "propertyNames": {"pattern": "^X-[A-Za-z0-9-]{1,60}$"},
            "additionalProperties": {"type": "string", "pattern": LINE_SHAPE, "maxLength": 900},
        },
    )
    idempotency_key: IdempotencyKey | None = None
