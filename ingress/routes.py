"""The send API's routes: POST /v1/messages, GET /v1/messages/{id}, POST .../cancel.

POST /v1/messages, top to bottom:
1. the bearer key names the tenant (401 otherwise);
2. the body validates as a push job, web subscriptions checked as the push
   worker checks them (400 `invalid_request` with details, nothing stored, so
   the same key works once the body is fixed);
3. the idempotency key, from the body or the `Idempotency-Key` header (both
   and different: 400; neither: 400 `idempotency_key_required`);
4. the fingerprint: SHA-256 of the canonical body, the key field left out,
   and of the kind (`ingress.accept`);
5. the group committer writes key row, message row and outbox row in one
   statement and one commit, shared with the requests that arrived meanwhile
   (`ingress.commit`); only after COMMIT: 202 `queued`, or 202
   `duplicate_ignored` with the first id and `Idempotent-Replayed: true`, or
   422 `idempotency_key_reused`.
The database unreachable: 503 with Retry-After; the client retries, same key.
POST /v1/webhooks (`ingress.webhooks`) takes the same steps for a webhook job;
GET and cancel serve every kind's messages.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from fastapi import APIRouter, Request, Response

from consumers import push_job_parts
from consumers.jobs.kind import shown_address
from dedupe import MessageStatus, parse_message_id
from ingress.accept import PUSH, queue_job
from ingress.body import decode_body, read_body, too_large, validated
from ingress.idempotency import one_key
from ingress.models import Cancelled, ErrorBody, MessageOut, NotCancellable, Queued
from ingress.openapi import ERRORS, SEND_EXTRA, SEND_RESPONSES
from ingress.reading import SendHeaders, Tenant, running_of, tenant_for
from ingress.refusals import NOT_FOUND, json_response

log = structlog.get_logger(__name__)

router = APIRouter()
_NOT_YOURS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no such message of yours"}
}


@router.post(
    "/v1/messages",
    operation_id="send_message",
    status_code=202,
    response_model=Queued,
    responses=SEND_RESPONSES,
    openapi_extra=SEND_EXTRA,
)
async def send(request: Request) -> Response:
    running = running_of(request)
    wanted = SendHeaders.read(request)
    tenant = await tenant_for(request, wanted.authorization)
    limit = running.settings.max_body_bytes
    read = await read_body(request, running.settings.max_request_bytes)
    body = decode_body(wanted.content_type, read)
    allowed = running.settings.webpush_allow_hosts
    send = validated(body, allow_hosts=allowed)
    key = one_key(send.idempotency_key, wanted.idempotency_key)
    body.pop("idempotency_key", None)
    # More devices than one job holds: the parts the worker gets, each under its limit.
    stored = [orjson.dumps(part.body) for part in push_job_parts("", body, allow_hosts=allowed)]
    if max(len(part) for part in stored) > limit:
        raise too_large(limit)
    return await queue_job(
        running,
        kind=PUSH,
        queue=running.settings.queue,
        tenant=tenant,
        key=key,
        body=body,
        stored=stored,
        targets=len(send.job.targets),  # repeats fold
    )


@router.get(
    "/v1/messages/{message_id}",
    operation_id="read_message",
    response_model=MessageOut,
    responses={**_NOT_YOURS, **ERRORS},
)
async def read(request: Request, message_id: str, tenant: Tenant) -> Response:
    message = parse_message_id(message_id)
    if message is None:
        raise NOT_FOUND
    running = running_of(request)
    async with running.db.acquire() as conn:
        view = await running.messages.find(conn, tenant, message)
    if view is None:
        raise NOT_FOUND
    return json_response(
        200,
        {
            "id": str(view.id),
            "status": str(view.status),
            "created_at": view.created_at.isoformat(),
            "updated_at": view.updated_at.isoformat(),
            "devices": {"sent": view.sent, "failed": view.failed, "pending": view.pending},
            "targets": [
                {
                    "index": t.index,
                    "status": t.status,
                    "platform": t.platform,
                    "address": shown(t.platform, t.address),
                    "provider_message_id": t.provider_message_id,
                    "failure_reason": t.failure_reason,
                }
                for t in view.targets
            ],
        },
    )


def shown(channel: str | None, address: str | None) -> str | None:
    return None if channel is None or address is None else shown_address(channel, address)


@router.post(
    "/v1/messages/{message_id}/cancel",
    operation_id="cancel_message",
    response_model=Cancelled,
    responses={
        **_NOT_YOURS,
        409: {"model": NotCancellable, "description": "a worker took it: too late"},
        **ERRORS,
    },
)
async def cancel(request: Request, message_id: str, tenant: Tenant) -> Response:
    message = parse_message_id(message_id)
    if message is None:
        raise NOT_FOUND
    running = running_of(request)
    async with running.db.acquire() as conn, conn.transaction():
        moved = await running.messages.cancel(conn, tenant, message)
    if moved.won or moved.already(MessageStatus.CANCELLED):
        log.info("message_cancelled", tenant=tenant, id=str(message), won=moved.won)
        return json_response(200, {"id": str(message), "status": "cancelled"})
    if moved.status is None:
        raise NOT_FOUND
    return json_response(409, {"error": "message_not_cancellable", "status": moved.status})
