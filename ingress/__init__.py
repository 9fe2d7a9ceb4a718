"""The HTTP send API: push, webhook and e-mail jobs in over HTTP with idempotency keys, and
its retrying client.

`idempotent-workers serve` runs the API (the `serve` extra: FastAPI, uvicorn);
`ingress.client.SendClient` calls it (the `client` extra: httpx). Names load
lazily, so the client does not need the server's libraries, nor the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ingress.settings import DEFAULT_PUSH_QUEUE, IngressSettings

if TYPE_CHECKING:
    from ingress.api import create_app
    from ingress.client import Backoff, GaveUp, JobKind, Refused, SendClient, SendError, Sent
    from ingress.keys import ApiKeys

_LAZY = {
    "create_app": "ingress.api",
    "ApiKeys": "ingress.keys",
    "Backoff": "ingress.client",
    "GaveUp": "ingress.client",
    "JobKind": "ingress.client",
    "Refused": "ingress.client",
    "SendClient": "ingress.client",
    "SendError": "ingress.client",
    "Sent": "ingress.client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ingress' has no attribute {name!r}")


__all__ = [
    "DEFAULT_PUSH_QUEUE",
    "ApiKeys",
    "Backoff",
    "GaveUp",
    "IngressSettings",
    "JobKind",
    "Refused",
    "SendClient",
    "SendError",
    "Sent",
    "create_app",
]
