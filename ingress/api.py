"""The HTTP send API, as a FastAPI app: POST a push job with an idempotency key, read it, cancel it.

POST /v1/messages, top to bottom:
1. the bearer key names the tenant (401 otherwise);
2. the body validates as a push job (400 `invalid_request` with details,
   nothing stored, so the same key works once the body is fixed);
3. the idempotency key, from the body or the `Idempotency-Key` header (both
   and different: 400; neither: 400 `idempotency_key_required`);
4. the fingerprint: SHA-256 of the canonical body, the key field left out;
5. the group committer writes key row, message row and outbox row in one
   statement and one commit, shared with the requests that arrived meanwhile
   (`ingress.commit`); only after COMMIT: 202 `queued`, or 202
   `duplicate_ignored` with the first id and `Idempotent-Replayed: true`, or
   422 `idempotency_key_reused`.
The database unreachable: 503 with Retry-After; the client retries, same key.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import asyncpg
import orjson
import structlog
from fastapi import Depends, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from consumers.settings import DatabaseSettings
from consumers.verdict import CONNECTION_ERRORS
from dedupe import (
    Acceptance,
    KeyVanished,
    Messages,
    MessageStatus,
    NewMessage,
    check_schema,
    fingerprint,
    parse_message_id,
)
from ingress.commit import Committer
from ingress.keys import ApiKeys
from ingress.models import (
    MAX_KEY_BYTES,
    Cancelled,
    ErrorBody,
    InvalidRequest,
    MessageOut,
    NotCancellable,
    Queued,
    SendRequest,
)
from ingress.settings import IngressSettings

log = structlog.get_logger(__name__)

REPLAYED_HEADER = "Idempotent-Replayed"
RETRY_AFTER_SECONDS = 1
UNAVAILABLE = (*CONNECTION_ERRORS, KeyVanished, asyncpg.PostgresError)


class _Running:
    """What the lifespan opened: the pool and the committer (None before start)."""

    def __init__(self, keys: ApiKeys) -> None:
        self.keys = keys
        self.pool: asyncpg.Pool | None = None
        self.committer: Committer | None = None

    @property
    def db(self) -> asyncpg.Pool:
        if self.pool is None:
            raise RuntimeError("the app is not started: run it under its lifespan")
        return self.pool


class Refusal(Exception):
    """An answer other than success: its status, its JSON body, its headers."""

    def __init__(
        self, status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body
        self.headers = dict(headers or {})


def _json(
    status: int, body: Mapping[str, Any], headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def _invalid(*details: tuple[str, str]) -> Refusal:
    return Refusal(
        400,
        {"error": "invalid_request", "details": [{"field": f, "message": m} for f, m in details]},
    )


UNAUTHORIZED = Refusal(401, {"error": "unauthorized"}, {"WWW-Authenticate": "Bearer"})
NOT_FOUND = Refusal(404, {"error": "not_found"})

_bearer = HTTPBearer(auto_error=False, description="A key from `idempotent-workers api-key`")


async def _tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant the bearer key belongs to; 401 without a key we made."""
    if credentials is None:
        raise UNAUTHORIZED
    running: _Running = request.app.state.running
    found = await running.keys.tenant_for(running.db, credentials.credentials)
    if found is None:
        raise UNAUTHORIZED
    return found


Tenant = Annotated[str, Depends(_tenant)]

_SEND_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "description": "The key, if not in the body: 1 to 128 bytes of UTF-8, no NUL",
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES},
        }
    ],
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SendRequest"}}},
    },
    "security": [{"HTTPBearer": []}],
}

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No key, or a key we never made"},
    503: {"model": ErrorBody, "description": "The database is unavailable: retry, same key"},
}


def create_app(settings: IngressSettings, database: DatabaseSettings) -> FastAPI:
    """The app; its lifespan opens the pool and starts the group committer."""
    keys = ApiKeys(database.schema, cache_seconds=settings.key_cache_seconds)
    messages = Messages(database.schema)
    running = _Running(keys)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(
            database.url, min_size=1, max_size=settings.lanes + database.pool_size
        )
        async with pool.acquire() as conn:
            await check_schema(conn, database.schema)
        committer = Committer(pool, messages, max_batch=settings.max_batch, lanes=settings.lanes)
        committer.start()
        running.pool, running.committer = pool, committer
        log.info("ingress_started", queue=settings.queue, schema=database.schema)
        try:
            yield
        finally:
            await committer.stop()
            await pool.close()

    app = FastAPI(
        title="idempotent-workers send API",
        version="1",
        description="Push jobs in over HTTP, each once, whatever the client retries.",
        lifespan=lifespan,
    )
    app.state.running = running

    @app.exception_handler(Refusal)
    async def refused(request: Request, exc: Refusal) -> Response:
        return _json(exc.status, exc.body, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        details = [(_field(e.get("loc", ())), str(e.get("msg", ""))) for e in exc.errors()]
        return refusal_response(_invalid(*details))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400:
            return refusal_response(_invalid(("body", str(exc.detail))))
        error = str(exc.detail).lower().replace(" ", "_")
        return _json(exc.status_code, {"error": error}, exc.headers)

    async def unavailable(request: Request, exc: Exception) -> Response:
        log.warning("ingress_unavailable", error=repr(exc))
        return _json(503, {"error": "unavailable"}, {"Retry-After": str(RETRY_AFTER_SECONDS)})

    for kind in UNAVAILABLE:
        app.add_exception_handler(kind, unavailable)

    @app.post(
        "/v1/messages",
        operation_id="send_message",
        status_code=202,
        response_model=Queued,
        responses={
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
            422: {"model": ErrorBody, "description": "idempotency_key_reused: another body"},
            **_ERRORS,
        },
        openapi_extra=_SEND_OPENAPI,
    )
    async def send(request: Request) -> Response:
        # Read and validated here, not through FastAPI's body and dependency
        # machinery: measured under load, that machinery took about a quarter
        # of the server's time per request. /openapi.json still says it all
        # (openapi_extra, and SendRequest added to the components below).
        wanted = _SendHeaders.read(request)
        tenant = await _tenant_for(request, wanted.authorization)
        raw_body = await request.body()
        job = _validated(wanted.content_type, raw_body)
        key = _one_key(job.idempotency_key, wanted.idempotency_key)
        body: dict[str, Any] = orjson.loads(raw_body)
        body.pop("idempotency_key", None)
        assert running.committer is not None
        answer = await running.committer.submit(
            NewMessage(
                tenant=tenant,
                idempotency_key=key,
                # SendRequest took it, so it holds only str, int, None, lists and objects
                fingerprint=fingerprint(body, plain=True),
                queue=settings.queue,
                targets=len({(t.platform, t.token) for t in job.targets}),  # repeats fold
                job=orjson.dumps(body),
            )
        )
        if answer.outcome is Acceptance.KEY_REUSED:
            return _json(422, {"error": "idempotency_key_reused"})
        replayed = answer.outcome is Acceptance.DUPLICATE_IGNORED
        return _json(
            202,
            {"status": str(answer.outcome), "id": str(answer.id)},
            {REPLAYED_HEADER: "true"} if replayed else None,
        )

    @app.get(
        "/v1/messages/{message_id}",
        operation_id="read_message",
        response_model=MessageOut,
        responses={404: {"model": ErrorBody, "description": "no such message of yours"}, **_ERRORS},
    )
    async def read(message_id: str, tenant: Tenant) -> Response:
        message = parse_message_id(message_id)
        if message is None:
            raise NOT_FOUND
        async with running.db.acquire() as conn:
            view = await messages.find(conn, tenant, message)
        if view is None:
            raise NOT_FOUND
        return _json(
            200,
            {
                "id": str(view.id),
                "status": str(view.status),
                "created_at": view.created_at.isoformat(),
                "updated_at": view.updated_at.isoformat(),
                "targets": [
                    {
                        "index": t.index,
                        "status": t.status,
                        "platform": t.platform,
                        "provider_message_id": t.provider_message_id,
                        "failure_reason": t.failure_reason,
                    }
                    for t in view.targets
                ],
            },
        )

    @app.post(
        "/v1/messages/{message_id}/cancel",
        operation_id="cancel_message",
        response_model=Cancelled,
        responses={
            404: {"model": ErrorBody, "description": "no such message of yours"},
            409: {"model": NotCancellable, "description": "a worker took it: too late"},
            **_ERRORS,
        },
    )
    async def cancel(message_id: str, tenant: Tenant) -> Response:
        message = parse_message_id(message_id)
        if message is None:
            raise NOT_FOUND
        async with running.db.acquire() as conn, conn.transaction():
            moved = await messages.cancel(conn, tenant, message)
        if moved.won or moved.already(MessageStatus.CANCELLED):
            log.info("message_cancelled", tenant=tenant, id=str(message), won=moved.won)
            return _json(200, {"id": str(message), "status": "cancelled"})
        if moved.status is None:
            raise NOT_FOUND
        return _json(409, {"error": "message_not_cancellable", "status": moved.status})

    def openapi() -> dict[str, Any]:
        """FastAPI's document, plus the SendRequest schema the send route validates by hand."""
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            body = SendRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(body.pop("$defs", {}))
            schemas["SendRequest"] = body
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    if settings.bench_endpoint:

        @app.post("/bench/trivial", status_code=202, include_in_schema=False)
        async def trivial(request: Request) -> Response:
            """The bench's baseline: the same server and framework, no database."""
            await request.body()
            return _json(202, {"status": "queued", "id": "trivial"})

    return app


def _field(loc: Sequence[Any]) -> str:
    """`targets.0.token` from pydantic's ("body", "targets", 0, "token")."""
    if len(loc) < 2 or not isinstance(loc[1], str):
        return "body" if not loc or loc[0] == "body" else str(loc[0])
    return ".".join(str(p) for p in loc[1:])


def refusal_response(refusal: Refusal) -> Response:
    return _json(refusal.status, refusal.body, refusal.headers)


@dataclass(frozen=True, slots=True, kw_only=True)
class _SendHeaders:
    """The headers POST /v1/messages reads, found in one pass over the raw list."""

    authorization: str = ""
    content_type: str = "application/json"
    idempotency_key: str | None = None

    @classmethod
    def read(cls, request: Request) -> _SendHeaders:
        # ASGI servers give the names lower case; reversed: a repeated header's first stands
        found: dict[bytes, bytes] = dict(reversed(request.scope["headers"]))
        key = found.get(b"idempotency-key")
        return cls(
            authorization=found.get(b"authorization", b"").decode("latin-1"),
            content_type=found.get(b"content-type", b"application/json").decode("latin-1"),
            idempotency_key=None if key is None else key.decode("latin-1"),
        )


async def _tenant_for(request: Request, authorization: str) -> str:
    """The bearer key's tenant; 401 without a key we made."""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credentials:
        raise UNAUTHORIZED
    running: _Running = request.app.state.running
    found = await running.keys.tenant_for(running.db, credentials.strip())
    if found is None:
        raise UNAUTHORIZED
    return found


def _validated(content_type: str, raw_body: bytes) -> SendRequest:
    """The body as a push job, or 400 invalid_request with every field that is wrong."""
    kind = content_type.split(";")[0].strip().lower()
    if kind != "application/json" and not kind.endswith("+json"):
        raise _invalid(("body", "Content-Type: application/json is required"))
    try:
        return SendRequest.model_validate_json(raw_body)
    except ValidationError as exc:
        raise _invalid(*((_field(("body", *e["loc"])), e["msg"]) for e in exc.errors())) from None


def _one_key(in_body: str | None, in_header: str | None) -> str:
    if in_body is not None and in_header is not None and in_body != in_header:
        raise _invalid(
            ("idempotency_key", "the body and the Idempotency-Key header give different keys")
        )
    key = in_body if in_body is not None else in_header
    if key is None:
        raise Refusal(400, {"error": "idempotency_key_required"})
    if not key or len(key.encode()) > MAX_KEY_BYTES:
        raise _invalid(("idempotency_key", f"1 to {MAX_KEY_BYTES} bytes of UTF-8"))
    if "\x00" in key:  # PostgreSQL's text cannot hold it: the group's statement would fail
        raise _invalid(("idempotency_key", "no NUL (U+0000) character"))
    return key
