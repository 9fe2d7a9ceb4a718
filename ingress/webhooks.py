"""POST /v1/webhooks: a webhook job in over HTTP, under the contract of POST /v1/messages.

Top to bottom:
1. the bearer key names the tenant (401 otherwise);
2. serve has a webhook queue (`--webhook-queue`, IW_INGRESS_WEBHOOK_QUEUE), else
   501 `kind_not_served`, before a byte of the body is read;
3. the body, at most the worker's limit (IW_MAX_BODY_BYTES; 413 past it), is a
   `WebhookRequest`, then a job the worker's own parser takes
   (`consumers.jobs.webhook.webhook_job_body`): 400 `invalid_request` naming the
   field, nothing stored. The door refuses what the worker would dead-letter, and
   unknown fields besides;
4. the idempotency key, from the body or the `Idempotency-Key` header (both and
   different: 400; neither: 400 `idempotency_key_required`);
5. the job stored is the body without its key and with `timestamp` set to the
   time it was taken when it has none, so every delivery sends the same bytes;
   the fingerprint is the body's as sent, and of the kind `webhook`
   (`ingress.accept`): the same key for a push is 422;
6. key row, message row and outbox row committed together (`ingress.accept`),
   then 202 `queued`, 202 `duplicate_ignored` with the first id and
   `Idempotent-Replayed: true`, or 422 `idempotency_key_reused`.

Whom it goes to is the worker's choice, once, when it takes the job (the tenant's
enabled endpoints taking the event type, or those `endpoints` names): GET
/v1/messages/{id} lists them from then on, each with its `webhook-id`.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request, Response

from consumers import InvalidWebhookJob, webhook_job_body
from ingress.accept import queue_job
from ingress.body import decode_body, job_refused, read_body, shaped, too_large, unknown_fields
from ingress.idempotency import one_key
from ingress.models import Queued
from ingress.openapi import NOT_SERVED, SEND_RESPONSES, job_extra
from ingress.reading import SendHeaders, running_of, tenant_for
from ingress.refusals import not_served
from ingress.webhook_models import WebhookRequest

KIND = "webhook"
router = APIRouter()


NO_WEBHOOK_QUEUE = not_served("webhook jobs", "--webhook-queue", "IW_INGRESS_WEBHOOK_QUEUE")


def webhook_job(body: dict[str, Any]) -> tuple[WebhookRequest, dict[str, Any]]:
    """`body` as the request it is and the job to store, which a webhook worker takes;
    400 naming what is wrong (the shape first, then the worker's own rules)."""
    given = shaped(WebhookRequest, body, unknown_fields(body, WebhookRequest))
    try:
        job = webhook_job_body(
            event_type=body["event_type"],
            payload=body["payload"],
            timestamp=body.get("timestamp"),  # None: now, once, stored
            endpoints=body.get("endpoints"),
        )
    except InvalidWebhookJob as exc:
        raise job_refused(exc) from None
    return given, job


@router.post(
    "/v1/webhooks",
    operation_id="send_webhook",
    status_code=202,
    response_model=Queued,
    responses={**SEND_RESPONSES, **NOT_SERVED},
    openapi_extra=job_extra("WebhookRequest"),
)
async def send_webhook(request: Request) -> Response:
    running = running_of(request)
    wanted = SendHeaders.read(request)
    tenant = await tenant_for(request, wanted.authorization)
    queue = running.settings.webhook_queue
    if queue is None:
        raise NO_WEBHOOK_QUEUE
    limit = running.settings.max_body_bytes
    body = decode_body(wanted.content_type, await read_body(request, limit))
    given, job = webhook_job(body)
    key = one_key(given.idempotency_key, wanted.idempotency_key)
    body.pop("idempotency_key", None)
    stored = orjson.dumps(job)
    if len(stored) > limit:
        raise too_large(limit)
    return await queue_job(
        running,
        kind=KIND,
        queue=queue,
        tenant=tenant,
        key=key,
        body=body,
        stored=[stored],
        targets=0,  # the worker chooses the endpoints
    )
