"""What /openapi.json says of the send API beyond what FastAPI sees in the routes.

POST /v1/messages reads its body and its `Idempotency-Key` header by hand
(`ingress.reading`), so FastAPI cannot see them: `SEND_EXTRA` declares both,
`SEND_RESPONSES` every answer, and `document(app)` adds the SendRequest
schema the extra refers to.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from ingress.models import MAX_KEY_BYTES, ErrorBody, InvalidRequest, SendRequest

REPLAYED_HEADER = "Idempotent-Replayed"

SEND_EXTRA: dict[str, Any] = {
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
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SendRequest"}}},
    },
    "security": [{"HTTPBearer": []}],
}

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
    413: {"model": ErrorBody, "description": "body_too_large: past the push worker's limit"},
    422: {"model": ErrorBody, "description": "idempotency_key_reused: another body"},
    **ERRORS,
}


def document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, plus the SendRequest schema the send route validates by hand."""
    if app.openapi_schema is None:
        found = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        body = SendRequest.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas = found.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(body.pop("$defs", {}))
        schemas["SendRequest"] = body
        app.openapi_schema = found
    return app.openapi_schema
