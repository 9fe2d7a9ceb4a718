"""What /openapi.json says of the send API beyond what FastAPI sees in the routes.

POST /v1/messages, /v1/webhooks and /v1/emails read their body and their
`Idempotency-Key` header by hand (`ingress.reading`), so FastAPI cannot see
them: `job_extra(schema)` declares both, `SEND_RESPONSES` every answer, and
`document(app)` adds the schemas (`BODIES`) the extras refer to. The endpoint
routes read their bodies by hand too (a size limit first): `body_extra(schema)`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from ingress.email_models import EmailRequest
from ingress.models import MAX_KEY_BYTES, ErrorBody, InvalidRequest, SendRequest
from ingress.webhook_models import EndpointIn, NotServed, RotateIn, WebhookRequest

REPLAYED_HEADER = "Idempotent-Replayed"
# The bodies read by hand, by their names in components/schemas.
BODIES: tuple[type[BaseModel], ...] = (
    SendRequest,
    WebhookRequest,
    EmailRequest,
    EndpointIn,
    RotateIn,
)


def body_extra(schema: str, *, required: bool = True) -> dict[str, Any]:
    """The request body of a route that reads it by hand: JSON of `schema`."""
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
        }
    }


def job_extra(schema: str) -> dict[str, Any]:
    """A job route's body (`schema`), its `Idempotency-Key` header and its bearer key."""
    return {**_KEY_AND_BEARER, **body_extra(schema)}


_KEY_AND_BEARER: dict[str, Any] = {
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": (
                "The key, if not in the body: 1 to 128 bytes of UTF-8, no NUL; plain,"
                " or quoted as an RFC 8941 sf-string (the same key)"
            ),
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES},
        }
    ],
    "security": [{"HTTPBearer": []}],
}
SEND_EXTRA = job_extra("SendRequest")

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No key, or a key we never made"},
    503: {"model": ErrorBody, "description": "The database is unavailable: retry, same key"},
}

SEND_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {
        "description": "queued, or duplicate_ignored with the first id",
        "links": {
            name: {"operationId": op, "parameters": {"message_id": "$response.body#/id"}}
            for name, op in (("Read", "read_message"), ("Cancel", "cancel_message"))
        },
        "headers": {
            REPLAYED_HEADER: {
                "description": "`true` when this answers a replay (duplicate_ignored)",
                "schema": {"type": "string", "enum": ["true"]},
            }
        },
    },
    400: {
        "model": InvalidRequest | ErrorBody,
        "description": "invalid_request (nothing stored), or idempotency_key_required",
    },
    413: {"model": ErrorBody, "description": "body_too_large: past the worker's limit"},
    422: {"model": ErrorBody, "description": "idempotency_key_reused: another body, or kind"},
    **ERRORS,
}
NOT_SERVED: dict[int | str, dict[str, Any]] = {
    501: {"model": NotServed, "description": "kind_not_served: serve has no queue for it"},
}
KEY_MISSING: dict[int | str, dict[str, Any]] = {
    503: {
        "model": NotServed | ErrorBody,
        "description": "webhook_secrets_key_missing: serve has no IW_WEBHOOK_SECRETS_KEY;"
        " or the database is unavailable",
    },
}


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, plus the schemas of the bodies the routes read by hand."""
    if app.openapi_schema is None:
        found = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = found.setdefault("components", {}).setdefault("schemas", {})
        for model in BODIES:
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(body.pop("$defs", {}))
            schemas[model.__name__] = body
        app.openapi_schema = found
    return app.openapi_schema
