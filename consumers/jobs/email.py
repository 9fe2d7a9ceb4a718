"""The e-mail job format: one AMQP message, one e-mail, one or more recipients.

    {
      "to": ["ada@example.com", "bob@example.com"],   1 to MAX_RECIPIENTS addresses
      "subject": "Your order shipped",
      "text": "It is on its way.",                     text, html: at least one
      "html": "<p>It is on its way.</p>",              both: multipart/alternative
      "from": "Shop <shop@example.com>",               optional: SmtpSettings.default_from
      "reply_to": "help@example.com",                  optional
      "headers": {"X-Order": "1042"}                   optional
    }

Each distinct address (its domain lower-cased) is one effect: a ledger row
(channel `email`, the address), a message of its own to that one recipient, a
Message-ID of its own, the same on every attempt. `email_job_body()` builds a job
on the publisher side and refuses what a worker would dead-letter
(`invalid_email_job`, the reason in `x-error`); `EMAIL` is the kind the send
ledger's runner reads e-mail jobs through. What an address, a mailbox and a
header may hold is `providers.mail`'s (no CR or LF anywhere: no header injection).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Self

import asyncpg

from consumers.jobs.kind import DeadTarget, InvalidJob, Recipient
from consumers.message.envelope import loads_json
from consumers.settings import Settings
from dedupe import DbConnection
from providers.mail import (
    Email,
    address_problem,
    header_problem,
    mailbox_problem,
    normal_address,
)

MAX_RECIPIENTS = 500  # addresses of one job
MAX_SUBJECT_CHARS = 998
CHANNEL = "email"


class InvalidEmailJob(InvalidJob):
    """The body is not an e-mail job; the message says which field is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EmailJob:
    to: tuple[str, ...]  # distinct, domains lower-cased; a recipient's index is its position
    subject: str
    text: str | None = None
    html: str | None = None
    sender: str | None = None  # the job's "from"
    reply_to: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def email_for(self, address: str) -> Email:
        """The e-mail one recipient of the job is sent."""
        return Email(
            to=address,
            subject=self.subject,
            text=self.text,
            html=self.html,
            sender=self.sender,
            reply_to=self.reply_to,
            headers=self.headers,
        )


def email_job_body(
    *,
    to: Sequence[str],
    subject: str,
    text: str | None = None,
    html: str | None = None,
    sender: str | None = None,
    reply_to: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON body of an e-mail job (publish it, or `ctx.emit` it, with a stable
    message_id); `sender` is the job's `from`."""
    job: dict[str, Any] = {"to": list(to), "subject": subject}
    for name, value in (("text", text), ("html", html), ("from", sender), ("reply_to", reply_to)):
        if value is not None:
            job[name] = value
    if headers:
        job["headers"] = dict(headers)
    parse_email_job(job)  # refuse to build what a worker would dead-letter
    return job


def parse_email_job(body: Mapping[str, Any]) -> EmailJob:
    """Parse and validate an e-mail job body; raise `InvalidEmailJob` saying what is wrong."""
    raw_to = body.get("to")
    if not isinstance(raw_to, list) or not raw_to:
        raise InvalidEmailJob("to: a non-empty list of e-mail addresses is required")
    if len(raw_to) > MAX_RECIPIENTS:
        raise InvalidEmailJob(f"to: at most {MAX_RECIPIENTS} addresses")
    to: list[str] = []
    for n, address in enumerate(raw_to):
        if (problem := address_problem(address)) is not None:
            raise InvalidEmailJob(f"to[{n}]: {problem}")
        normal = normal_address(address)
        if normal not in to:  # one address twice in a job gets one e-mail
            to.append(normal)
    subject = body.get("subject")
    if not isinstance(subject, str):
        raise InvalidEmailJob("subject: a string is required")
    if len(subject) > MAX_SUBJECT_CHARS or any(c in subject for c in "\r\n\x00"):
        raise InvalidEmailJob(f"subject: one line of at most {MAX_SUBJECT_CHARS} characters")
    text, html = body.get("text"), body.get("html")
    if text is None and html is None:
        raise InvalidEmailJob("text or html: at least one is required")
    for name, value in (("text", text), ("html", html)):
        if value is not None and not isinstance(value, str):
            raise InvalidEmailJob(f"{name}: a string")
        if value is not None and "\x00" in value:
            raise InvalidEmailJob(f"{name}: no NUL (U+0000) character")
    for name in ("from", "reply_to"):
        value = body.get(name)
        if value is not None and (problem := mailbox_problem(value)) is not None:
            raise InvalidEmailJob(f"{name}: {problem}")
    headers = body.get("headers", {})
    if not isinstance(headers, dict):
        raise InvalidEmailJob("headers: an object of strings")
    for header, value in headers.items():
        if (problem := header_problem(header, value)) is not None:
            raise InvalidEmailJob(f"headers.{header}: {problem}")
    return EmailJob(
        to=tuple(to),
        subject=subject,
        text=text,
        html=html,
        sender=body.get("from"),
        reply_to=body.get("reply_to"),
        headers=MappingProxyType(dict(headers)),
    )


def addresses_named(body: bytes, *, max_body_bytes: int) -> int:
    """The recipients a delivered job's body names, read before its batch decodes it
    (repeated addresses fold later: never an undercount); 1 for a body the batch
    will refuse."""
    if len(body) > max_body_bytes:
        return 1
    try:
        value = loads_json(body)
    except (ValueError, RecursionError):
        return 1
    to = value.get("to") if isinstance(value, dict) else None
    return max(1, len(to)) if isinstance(to, list) else 1


class EmailKind:
    """E-mail jobs as the send ledger's runner reads them (`consumers.jobs.kind`)."""

    name = "email"

    def bound(self, pool: asyncpg.Pool, settings: Settings) -> Self:
        return self

    def parse(self, body: Mapping[str, Any]) -> EmailJob:
        return parse_email_job(body)

    def weigh(self, body: bytes, *, max_body_bytes: int) -> int:
        return addresses_named(body, max_body_bytes=max_body_bytes)

    def collapse_key(self, job: EmailJob) -> str | None:
        return None  # each recipient's Message-ID is its own (`SmtpSettings.message_id`)

    async def recipients(
        self, tx: DbConnection, jobs: Sequence[tuple[str, EmailJob]]
    ) -> list[list[Recipient]]:
        return [[Recipient(channel=CHANNEL, address=a) for a in job.to] for _, job in jobs]

    async def effect(
        self, job: EmailJob, index: int, recipient: Recipient, *, tenant: str
    ) -> Email:
        return job.email_for(recipient.address)

    async def gone(self, tx: DbConnection, dead: DeadTarget) -> None:
        """Nothing of ours: the app's `on_dead_address` may suppress the address."""


EMAIL = EmailKind()
