"""The HTTP send API as a FastAPI app: POST a job with an idempotency key, read it, cancel it.

ingress.routes      push jobs in, any message read or cancelled; POST /v1/messages top to bottom
ingress.webhooks    webhook jobs in (POST /v1/webhooks), the same contract
ingress.emails      e-mail jobs in (POST /v1/emails), the same contract
ingress.endpoints   the tenant's webhook endpoints and their signing secrets
ingress.accept      the steps every job route ends with: fingerprint, commit, answer
ingress.reading     what a request brings: headers, tenant, body, key
ingress.refusals    every answer other than success, and the handlers writing them
ingress.openapi     what /openapi.json says beyond what FastAPI sees
ingress.commit      the group committer the job routes hand their rows to
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import structlog
from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from consumers import DatabaseSettings, WebhookSettings, tracing
from consumers.jobs.webhook_endpoints import secret_box
from dedupe import Messages, WebhookEndpoints, check_schema
from ingress import emails, endpoints, openapi, routes, webhooks
from ingress.commit import Committer
from ingress.keys import ApiKeys
from ingress.reading import Running
from ingress.refusals import add_exception_handlers
from ingress.settings import IngressSettings

log = structlog.get_logger(__name__)


def server_spans() -> TelemetryConfig:
    """FastAPI's own OpenTelemetry SERVER span per request (it continues the request's
    `traceparent` and names the span by the route), through the process's tracer
    provider when tracing is on (`consumers.telemetry.tracing`); nothing when off.
    Its metrics and log records stay off: Prometheus and structlog have those."""
    provider = tracing().tracer_provider()
    if provider is None:
        return {"tracing": False, "metrics": False, "logs": False}
    return {"tracer_provider": provider, "metrics": False, "logs": False, "operation_spans": False}


def create_app(
    settings: IngressSettings,
    database: DatabaseSettings,
    *,
    webhook_settings: WebhookSettings | None = None,
) -> FastAPI:
    """The app; its lifespan opens the pool and starts the group committer.

    `webhook_settings`: the endpoints' rules and the key of their secrets
    (`Settings.webhooks`, IW_WEBHOOK_*); without a key the routes that make a secret
    answer 503. A key that is no Fernet key raises `ConfigurationError`."""
    given = webhook_settings or WebhookSettings()
    running = Running(
        settings=settings,
        keys=ApiKeys(
            database.schema,
            cache_seconds=settings.key_cache_seconds,
            bad_key_seconds=settings.bad_key_seconds,
        ),
        messages=Messages(database.schema),
        endpoints=WebhookEndpoints(database.schema),
        webhooks=given,
        box=secret_box(given.secrets_keys) if given.secrets_keys else None,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(
            database.url, min_size=1, max_size=settings.lanes + database.pool_size
        )
        async with pool.acquire() as conn:
            await check_schema(conn, database.schema)
        committer = Committer(
            pool, running.messages, max_batch=settings.max_batch, lanes=settings.lanes
        )
        committer.start()
        running.pool, running.committer = pool, committer
        log.info(
            "ingress_started",
            queue=settings.queue,
            webhook_queue=settings.webhook_queue,
            email_queue=settings.email_queue,
            schema=database.schema,
            webhook_secrets_key=running.box is not None,
        )
        try:
            yield
        finally:
            await committer.stop()
            await pool.close()

    app = FastAPI(
        title="idempotent-workers send API",
        version="1",
        description="Push, webhook and e-mail jobs in over HTTP, each once, whatever the client"
        " retries.",
        lifespan=lifespan,
        telemetry=server_spans(),
    )
    app.state.running = running
    add_exception_handlers(app)
    app.include_router(routes.router)
    app.include_router(webhooks.router)
    app.include_router(emails.router)
    app.include_router(endpoints.router)

    def document() -> dict[str, Any]:
        return openapi.document(app)

    app.openapi = document  # type: ignore[method-assign]
    return app
