"""The API key's tenant's webhook endpoints: add, list, read, rotate, disable, enable, delete.

    POST   /v1/webhook-endpoints               201: the endpoint and its signing secret, once
    GET    /v1/webhook-endpoints               200: every endpoint of the tenant, secrets by prefix
    GET    /v1/webhook-endpoints/{id}          200: one, secrets by prefix
    POST   /v1/webhook-endpoints/{id}/rotate   200: a new secret, once; the old ones sign
                                               beside it for `overlap_hours`
    POST   /v1/webhook-endpoints/{id}/disable  200: new jobs skip it, its pending calls fail
    POST   /v1/webhook-endpoints/{id}/enable   200
    DELETE /v1/webhook-endpoints/{id}          204: the endpoint and its secrets deleted

The same store and rules as `idempotent-workers webhook endpoint ...`
(`dedupe.WebhookEndpoints`, `consumers.jobs.webhook_endpoints`): a URL is https, or
http to a host of IW_WEBHOOK_ALLOW_HTTP_HOSTS; a secret is kept encrypted under
IW_WEBHOOK_SECRETS_KEY and shown whole only in the answer that made it. Without
that key, add and rotate answer 503 `webhook_secrets_key_missing` and the other
routes work. Every route is the tenant's: another tenant's id is 404, as is an id
that is none. No log line holds a secret or a URL (a URL's query may hold a token).
Disable and enable answer the endpoint's state whatever it was, so a retry is
harmless; a retried add makes a second endpoint, a retried rotate a third secret
(the one before still signs for the overlap): list, and delete what is extra.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import structlog
from fastapi import APIRouter, Request, Response

from consumers.jobs.webhook import ENDPOINT_ID_PATTERN
from consumers.jobs.webhook_endpoints import url_problem
from dedupe import SecretBox, WebhookEndpoint, shown_secret
from ingress.body import decode_body, read_body, shaped, unknown_fields
from ingress.models import ErrorBody, InvalidRequest
from ingress.openapi import ERRORS, KEY_MISSING, body_extra
from ingress.reading import Running, SendHeaders, Tenant, running_of
from ingress.refusals import NOT_FOUND, Refusal, invalid, json_response
from ingress.webhook_models import (
    EndpointIn,
    EndpointList,
    EndpointMade,
    EndpointOut,
    Rotated,
    RotateIn,
)

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/v1/webhook-endpoints")
MAX_BODY_BYTES = 65_536  # an endpoint's URL and event types fit many times over
_ID = re.compile(ENDPOINT_ID_PATTERN)
_ANSWERS: dict[int | str, dict[str, Any]] = {
    400: {"model": InvalidRequest, "description": "the field and what is wrong; nothing stored"},
    404: {"model": ErrorBody, "description": "no such endpoint of yours"},
    413: {"model": ErrorBody, "description": "body_too_large"},
    **ERRORS,
}
KEY_MISSING_REFUSAL = Refusal(
    503,
    {
        "error": "webhook_secrets_key_missing",
        "message": "serve has no IW_WEBHOOK_SECRETS_KEY: signing secrets are kept encrypted"
        " under it, so none can be made (see `idempotent-workers webhook endpoint`)",
    },
)


def _box(running: Running) -> SecretBox:
    if running.box is None:
        raise KEY_MISSING_REFUSAL
    return running.box


async def _body(request: Request) -> dict[str, Any]:
    raw = await read_body(request, MAX_BODY_BYTES)
    return decode_body(SendHeaders.read(request).content_type, raw) if raw else {}


def _endpoint_id(text: str) -> str:
    """An id in the path; one that no endpoint can have is 404 without a query."""
    if not _ID.fullmatch(text):
        raise NOT_FOUND
    return text


def shown(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """An endpoint as every answer shows it: its secrets by their prefixes only."""
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "state": "enabled" if endpoint.disabled_at is None else "disabled",
        "disabled_reason": endpoint.disabled_reason,
        "created_at": endpoint.created_at.isoformat(),
        "secrets": [
            {
                "prefix": shown_secret(s.prefix),
                "created_at": s.created_at.isoformat(),
                "expires_at": None if s.expires_at is None else s.expires_at.isoformat(),
            }
            for s in endpoint.secrets
        ],
    }


async def _one(running: Running, tenant: str, endpoint_id: str) -> WebhookEndpoint:
    async with running.db.acquire() as conn:
        found = await running.endpoints.endpoints(conn, tenant=tenant, endpoint_id=endpoint_id)
    if not found:
        raise NOT_FOUND
    return found[0]


_MADE: dict[int | str, dict[str, Any]] = {
    201: {
        "description": "the endpoint, and its signing secret: shown this once",
        "links": {
            name: {"operationId": op, "parameters": {"endpoint_id": "$response.body#/id"}}
            for name, op in (
                ("Read", "read_webhook_endpoint"),
                ("Rotate", "rotate_webhook_secret"),
                ("Disable", "disable_webhook_endpoint"),
                ("Enable", "enable_webhook_endpoint"),
                ("Delete", "delete_webhook_endpoint"),
            )
        },
    }
}


@router.post(
    "",
    operation_id="add_webhook_endpoint",
    status_code=201,
    response_model=EndpointMade,
    responses={**_MADE, **_ANSWERS, **KEY_MISSING},
    openapi_extra=body_extra("EndpointIn"),
)
async def add(request: Request, tenant: Tenant) -> Response:
    running = running_of(request)
    box = _box(running)
    body = await _body(request)
    wanted = shaped(EndpointIn, body, unknown_fields(body, EndpointIn))
    if (problem := url_problem(wanted.url, running.webhooks.allow_http_hosts)) is not None:
        raise invalid(("url", problem))
    async with running.db.acquire() as conn:
        endpoint, secret = await running.endpoints.add(
            conn, tenant=tenant, url=wanted.url, event_types=wanted.event_types, box=box
        )
    log.info("webhook_endpoint_added", tenant=tenant, endpoint=endpoint.id)
    return json_response(201, {**shown(endpoint), "secret": secret})


@router.get(
    "",
    operation_id="list_webhook_endpoints",
    response_model=EndpointList,
    responses=ERRORS,
)
async def listing(request: Request, tenant: Tenant) -> Response:
    running = running_of(request)
    async with running.db.acquire() as conn:
        found = await running.endpoints.endpoints(conn, tenant=tenant)
    return json_response(200, {"endpoints": [shown(e) for e in found]})


@router.get(
    "/{endpoint_id}",
    operation_id="read_webhook_endpoint",
    response_model=EndpointOut,
    responses=_ANSWERS,
)
async def read(request: Request, endpoint_id: str, tenant: Tenant) -> Response:
    endpoint = await _one(running_of(request), tenant, _endpoint_id(endpoint_id))
    return json_response(200, shown(endpoint))


@router.post(
    "/{endpoint_id}/rotate",
    operation_id="rotate_webhook_secret",
    response_model=Rotated,
    responses={**_ANSWERS, **KEY_MISSING},
    openapi_extra=body_extra("RotateIn", required=False),
)
async def rotate(request: Request, endpoint_id: str, tenant: Tenant) -> Response:
    running = running_of(request)
    wanted_id = _endpoint_id(endpoint_id)
    box = _box(running)
    body = await _body(request)
    wanted = shaped(RotateIn, body, unknown_fields(body, RotateIn))
    hours = wanted.overlap_hours
    if hours is None:
        hours = running.webhooks.rotation_overlap_hours
    async with running.db.acquire() as conn:
        secret = await running.endpoints.rotate(
            conn, wanted_id, overlap=timedelta(hours=hours), box=box, tenant=tenant
        )
    if secret is None:
        raise NOT_FOUND
    log.info("webhook_secret_rotated", tenant=tenant, endpoint=wanted_id, overlap_hours=hours)
    endpoint = await _one(running, tenant, wanted_id)
    return json_response(
        200, {"id": wanted_id, "secret": secret, "secrets": shown(endpoint)["secrets"]}
    )


async def _switch(request: Request, endpoint_id: str, tenant: str, *, enable: bool) -> Response:
    running = running_of(request)
    wanted_id = _endpoint_id(endpoint_id)
    store = running.endpoints
    async with running.db.acquire() as conn:
        if enable:
            changed = await store.enable(conn, wanted_id, tenant=tenant)
        else:
            reason = "disabled through the send API"
            changed = await store.disable(conn, wanted_id, reason=reason, tenant=tenant)
    endpoint = await _one(running, tenant, wanted_id)  # 404 if none; its state if unchanged
    if changed:
        event = "webhook_endpoint_enabled" if enable else "webhook_endpoint_disabled"
        log.info(event, tenant=tenant, endpoint=wanted_id)
    return json_response(200, shown(endpoint))


@router.post(
    "/{endpoint_id}/disable",
    operation_id="disable_webhook_endpoint",
    response_model=EndpointOut,
    responses=_ANSWERS,
)
async def disable(request: Request, endpoint_id: str, tenant: Tenant) -> Response:
    return await _switch(request, endpoint_id, tenant, enable=False)


@router.post(
    "/{endpoint_id}/enable",
    operation_id="enable_webhook_endpoint",
    response_model=EndpointOut,
    responses=_ANSWERS,
)
async def enable(request: Request, endpoint_id: str, tenant: Tenant) -> Response:
    return await _switch(request, endpoint_id, tenant, enable=True)


@router.delete(
    "/{endpoint_id}",
    operation_id="delete_webhook_endpoint",
    status_code=204,
    responses=_ANSWERS,
)
async def delete(request: Request, endpoint_id: str, tenant: Tenant) -> Response:
    running = running_of(request)
    wanted_id = _endpoint_id(endpoint_id)
    async with running.db.acquire() as conn:
        removed = await running.endpoints.remove(conn, wanted_id, tenant=tenant)
    if not removed:
        raise NOT_FOUND
    log.info("webhook_endpoint_deleted", tenant=tenant, endpoint=wanted_id)
    return Response(status_code=204)
