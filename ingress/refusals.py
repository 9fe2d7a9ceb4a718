"""The send API's answers other than success, and the exception handlers that write them.

    Refusal(status, body, headers)   raised anywhere in a request, answered as JSON
    RequestValidationError           FastAPI's own (path parameters): 400 invalid_request
    HTTPException                    Starlette's (404 route, 405): {"error": "not_found"}
    UNAVAILABLE                      the database away: 503 with Retry-After

Every refusal is JSON with an `error` field; `invalid_request` also lists
the fields that are wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import orjson
import structlog
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dedupe import KeyVanished
from dedupe.lost import CONNECTION_ERRORS

log = structlog.get_logger(__name__)

RETRY_AFTER_SECONDS = 1
UNAVAILABLE = (*CONNECTION_ERRORS, KeyVanished, asyncpg.PostgresError)


class Refusal(Exception):
    """An answer other than success: its status, its JSON body, its headers."""

    def __init__(
        self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def json_response(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def invalid(*details: tuple[str, str]) -> Refusal:
    """400 invalid_request, with a field and a message for each thing wrong."""
    return Refusal(
        400,
        {"error": "invalid_request", "details": [{"field": f, "message": m} for f, m in details]},
    )


UNAUTHORIZED = Refusal(401, {"error": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
NOT_FOUND = Refusal(404, {"error": "not_found"})
# The client went before its body was whole (it hung up, or was closed for its pace by
# `consumers.runtime.http_limits`): nobody reads this answer, but the request ends as a
# refusal, not a traceback in the server's log. 499 is nginx's name for it.
CLIENT_GONE = Refusal(499, {"error": "client_closed_request"})


def not_served(what: str, flag: str, variable: str) -> Refusal:
    """501 kind_not_served: this serve has no queue for a kind of job."""
    message = f"this server takes no {what}: start serve with {flag} (or {variable})"
    return Refusal(501, {"error": "kind_not_served", "message": message})


def field_name(loc: Sequence[Any]) -> str:
    """`targets.0.token` from pydantic's ("body", "targets", 0, "token")."""
    if len(loc) < 2 or not isinstance(loc[1], str):
        return "body" if not loc or loc[0] == "body" else str(loc[0])
    return ".".join(str(p) for p in loc[1:])


def refusal_response(refusal: Refusal) -> Response:
    return json_response(refusal.status, refusal.body, refusal.headers)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refusal)
    return refusal_response(exc)


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    details = [(field_name(e.get("loc", ())), str(e.get("msg", ""))) for e in exc.errors()]
    return refusal_response(invalid(*details))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:
        return refusal_response(invalid(("body", str(exc.detail))))
    error = str(exc.detail).lower().replace(" ", "_")
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and (allowed := _allowed(request)):
        headers["Allow"] = ", ".join(allowed)
    return json_response(exc.status_code, {"error": error}, headers)


def _allowed(request: Request) -> list[str]:
    """Every method the API document gives the request's path. Where one path has a route
    per method (GET and POST of a collection), the 405 of Starlette, and of FastAPI's
    included routers, names the first route's only."""
    path = request.url.path
    methods: set[str] = set()
    for template, item in request.app.openapi().get("paths", {}).items():
        pattern = "".join(
            "[^/]+" if part.startswith("{") else re.escape(part)
            for part in re.split(r"(\{[^}]+\})", template)
        )
        if re.fullmatch(pattern, path):
            methods |= {m.upper() for m in item if m in _METHODS}
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


_METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


async def _unavailable(request: Request, exc: Exception) -> Response:
    log.warning("ingress_unavailable", error=repr(exc))
    return json_response(503, {"error": "unavailable"}, {"Retry-After": str(RETRY_AFTER_SECONDS)})


def add_exception_handlers(app: FastAPI) -> None:
    """Every refusal answered as JSON: ours, FastAPI's, Starlette's, the database's."""
    app.add_exception_handler(Refusal, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, _unavailable)
