"""The values an API channel works with, readable without httpx (the `api` extra):
the call a job asks for, the request a subclass makes of it, the answer it reads,
and the client's settings. `providers.idempotent_api` sends them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


class InvalidCall(ValueError):
    """A job body the API cannot take; the message says which field and why
    (`IdempotentApi.validate` raises it, the door and the worker refuse the job)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiCall:
    """One call a job asks for: its JSON object, and the tenant whose job it is."""

    tenant: str
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiRequest:
    """An HTTP request to the API: `path` is joined to the base URL; the body is
    `json` (any JSON value) or `form` (form-encoded, as Stripe takes it) or none;
    `params` go in the query string; `headers` are added to the client's own."""

    method: str
    path: str
    json: Any = None
    form: Mapping[str, str] | None = None
    params: Mapping[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.json is not None and self.form is not None:
            raise ValueError("an ApiRequest has a json body or a form body, not both")


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiResponse:
    """What the API answered: status, headers (names lower-cased) and body."""

    status: int
    headers: Mapping[str, str]
    content: bytes

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON."""
        try:
            return json.loads(self.content)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiSettings:
    """Where and how to call an API.

    `base_url`: None for the class's own (`IdempotentApi.base_url`); `headers` go
    with every request (an `Authorization` header: never logged, not in repr).
    `timeout_seconds` bounds writing the request and reading the answer once
    connected, `connect_timeout_seconds` the connection: their sum is the
    sender's `answer_seconds`. `max_in_flight`: the calls at once (the client's
    connections, kept alive between calls)."""

    base_url: str | None = None
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    timeout_seconds: float = 10.0
    connect_timeout_seconds: float = 3.0
    max_in_flight: int = 16

    def __post_init__(self) -> None:
        if not (self.timeout_seconds > 0 and self.connect_timeout_seconds > 0):
            raise ValueError("timeout_seconds and connect_timeout_seconds: positive")
        if self.max_in_flight < 1:
            raise ValueError("max_in_flight: at least 1")
