"""POST /v1/emails: an e-mail job in over HTTP, under the contract of POST /v1/messages.

Top to bottom:
1. the bearer key names the tenant (401 otherwise);
2. serve has an e-mail queue (`--email-queue`, IW_INGRESS_EMAIL_QUEUE), else 501
   `kind_not_served`, before a byte of the body is read;
3. the body, at most the worker's limit (IW_MAX_BODY_BYTES; 413 past it), is an
   `EmailRequest`, then a job the worker's own parser takes
   (`consumers.jobs.email.parse_email_job`: addresses, mailboxes, headers without
   CR, LF or NUL): 400 `invalid_request` naming the field, nothing stored;
4. the idempotency key, from the body or the `Idempotency-Key` header;
5. the job stored is the body without its key; the fingerprint is the body's, and
   of the kind `email` (`ingress.accept`): the same key for a push is 422;
6. key row, message row and outbox row committed together (`ingress.accept`),
   then 202 `queued`, 202 `duplicate_ignored` with the first id and
   `Idempotent-Replayed: true`, or 422 `idempotency_key_reused`.

Its recipients are known now (the distinct addresses of `to`): GET
/v1/messages/{id} lists each, `pending` until a worker sends it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from consumers import EmailJob, InvalidEmailJob, parse_email_job
from ingress.accept import queue_job
from ingress.body import decode_body, job_refused, read_body, shaped, unknown_fields
from ingress.email_models import EmailRequest
from ingress.idempotency import one_key
from ingress.models import Queued
from ingress.openapi import NOT_SERVED, SEND_RESPONSES, job_extra
from ingress.reading import SendHeaders, running_of, tenant_for
from ingress.refusals import not_served

KIND = "email"
NO_EMAIL_QUEUE = not_served("e-mail jobs", "--email-queue", "IW_INGRESS_EMAIL_QUEUE")

router = APIRouter()


def _open_ended(body: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Unknown fields, and headers that are no text: found before pydantic would build
    an error for each."""
    yield from unknown_fields(body, EmailRequest)
    headers = body.get("headers")
    if isinstance(headers, dict):
        for name, value in headers.items():
            if not isinstance(value, str):
                yield f"headers.{name}", "a string is required"


def email_job(body: dict[str, Any]) -> tuple[EmailRequest, EmailJob]:
    """`body` as the request it is and the job a worker reads from it; 400 naming what
    is wrong (the shape first, then the worker's own rules)."""
    given = shaped(EmailRequest, body, _open_ended(body))
    try:
        return given, parse_email_job(body)
    except InvalidEmailJob as exc:
        raise job_refused(exc) from None


@router.post(
    "/v1/emails",
    operation_id="send_email",
    status_code=202,
    response_model=Queued,
    responses={**SEND_RESPONSES, **NOT_SERVED},
    openapi_extra=job_extra("EmailRequest"),
)
async def send_email(request: Request) -> Response:
    running = running_of(request)
    wanted = SendHeaders.read(request)
    tenant = await tenant_for(request, wanted.authorization)
    queue = running.settings.email_queue
    if queue is None:
        raise NO_EMAIL_QUEUE
    limit = running.settings.max_body_bytes
    body = decode_body(wanted.content_type, await read_body(request, limit))
    given, job = email_job(body)
    key = one_key(given.idempotency_key, wanted.idempotency_key)
    body.pop("idempotency_key", None)
    return await queue_job(
        running,
        kind=KIND,
        queue=queue,
        tenant=tenant,
        key=key,
        body=body,
        stored=[orjson.dumps(body)],
        targets=len(job.to),  # repeated addresses fold
    )
