"""What a request brings, read by hand: its headers, its tenant, its body as a push job, its key.

POST /v1/messages reads here, not through FastAPI's body and dependency
machinery: measured under load, that machinery took about a quarter of the
server's time per request. /openapi.json still says it all
(`ingress.openapi`). GET and cancel take their tenant through `Tenant`, a
FastAPI dependency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

import asyncpg
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from consumers import WebhookSettings
from dedupe import Messages, SecretBox, WebhookEndpoints
from ingress.commit import Committer
from ingress.keys import ApiKeys
from ingress.refusals import UNAUTHORIZED
from ingress.settings import IngressSettings


@dataclass(slots=True, kw_only=True)
class Running:
    """The app's state: what it was made with, and what its lifespan opened (None before)."""

    settings: IngressSettings
    keys: ApiKeys
    messages: Messages
    endpoints: WebhookEndpoints
    webhooks: WebhookSettings  # the endpoints' rules (IW_WEBHOOK_*)
    box: SecretBox | None  # encrypts their secrets; None: IW_WEBHOOK_SECRETS_KEY unset
    pool: asyncpg.Pool | None = None
    committer: Committer | None = field(default=None)

    @property
    def db(self) -> asyncpg.Pool:
        if self.pool is None:
            raise RuntimeError("the app is not started: run it under its lifespan")
        return self.pool


def running_of(request: Request) -> Running:
    running: Running = request.app.state.running
    return running


_bearer = HTTPBearer(auto_error=False, description="A key from `idempotent-workers api-key`")


async def _tenant(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    """The tenant the bearer key belongs to; 401 without a key we made."""
    if credentials is None:
        raise UNAUTHORIZED
    running = running_of(request)
    found = await running.keys.tenant_for(running.db, credentials.credentials)
    if found is None:
        raise UNAUTHORIZED
    return found


Tenant = Annotated[str, Depends(_tenant)]


@dataclass(frozen=True, slots=True, kw_only=True)
class SendHeaders:
    """The headers POST /v1/messages reads, found in one pass over the raw list."""

    authorization: str = ""
    content_type: str = "application/json"
    idempotency_key: bytes | None = None  # as sent: ingress.idempotency reads it

    @classmethod
    def read(cls, request: Request) -> SendHeaders:
        # ASGI servers give the names lower case; reversed: a repeated header's first stands
        found: dict[bytes, bytes] = dict(reversed(request.scope["headers"]))
        return cls(
            authorization=found.get(b"authorization", b"").decode("latin-1"),
            content_type=found.get(b"content-type", b"application/json").decode("latin-1"),
            idempotency_key=found.get(b"idempotency-key"),
        )


async def tenant_for(request: Request, authorization: str) -> str:
    """The bearer key's tenant; 401 without a key we made."""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credentials:
        raise UNAUTHORIZED
    running = running_of(request)
    found = await running.keys.tenant_for(running.db, credentials.strip())
    if found is None:
        raise UNAUTHORIZED
    return found
