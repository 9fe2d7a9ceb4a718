"""The send API's client: one idempotency key per intent, retried until an answer is final.

    async with SendClient("https://push.example", api_key=key) as client:
        sent = await client.send(job)                 # a key is made once, for this call
        sent = await client.send(job, idempotency_key="order-1042-shipped")
        sent.id, sent.status, sent.replayed
        await client.send(event, kind=JobKind.WEBHOOK)   # POST /v1/webhooks; EMAIL: /v1/emails

Every attempt of one `send` carries the same key, so a retry after a timeout
is answered `duplicate_ignored` with the first id, never a second message.

    answer                               what send() does
    202                                  returns it (`replayed` from Idempotent-Replayed)
    429, 500, 502, 503, 504              retries: Retry-After if given, else backoff
    timeout, connection error            retries (the request may have landed: same key)
    400, 401, 403, 404, 409, 422, other  raises Refused at once, never retried

Backoff: exponential with full jitter (a random wait in [0, min(cap, base *
2**attempt)]), cap 30 s, `max_attempts` in all; a Retry-After wins over the
draw, capped likewise. Out of attempts: raises GaveUp with the last failure.

SendError
  Refused     a final answer other than 202: status and the body's error
  GaveUp      every attempt failed retryably; `last` says how the last one did
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Self

import httpx

RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})


class JobKind(StrEnum):
    """What a job is, and so the route it is sent to."""

    PUSH = "push"
    WEBHOOK = "webhook"
    EMAIL = "email"

    @property
    def route(self) -> str:
        return {"push": "/v1/messages", "webhook": "/v1/webhooks", "email": "/v1/emails"}[self]


class SendError(Exception):
    """Root of what `SendClient` raises."""


class Refused(SendError):
    """The server answered, finally, with something other than 202."""

    def __init__(self, status: int, body: Mapping[str, Any]) -> None:
        super().__init__(f"{status} {body.get('error', body)}")
        self.status = status
        self.error = str(body.get("error", ""))
        self.body = body


class GaveUp(SendError):
    """Every attempt failed with a retryable answer or a transport error."""

    def __init__(self, attempts: int, last: str) -> None:
        super().__init__(f"gave up after {attempts} attempts; last: {last}")
        self.attempts = attempts
        self.last = last


@dataclass(frozen=True, slots=True, kw_only=True)
class Sent:
    id: str
    status: str  # queued | duplicate_ignored
    replayed: bool  # the server had this key already (Idempotent-Replayed: true)
    idempotency_key: str
    attempts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Exponential backoff with full jitter; a Retry-After wins over the draw."""

    base_seconds: float = 0.2
    cap_seconds: float = 30.0
    max_attempts: int = 6
    rng: random.Random = field(default_factory=random.Random, compare=False)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if retry_after is not None:
            return min(self.cap_seconds, max(0.0, retry_after))
        return self.rng.uniform(0, min(self.cap_seconds, self.base_seconds * 2 ** (attempt - 1)))


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP date; None if absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class SendClient:
    """POST a job with a key per intent; see the module docstring for the retry table."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str,
        timeout_seconds: float = 10.0,
        backoff: Backoff | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_seconds,
            transport=transport,
        )
        self._backoff = backoff or Backoff()
        self._sleep = sleep

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def send(
        self,
        job: Mapping[str, Any],
        *,
        idempotency_key: str | None = None,
        kind: JobKind = JobKind.PUSH,
    ) -> Sent:
        """Send one job of `kind`; retried with the same key until the answer is final."""
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        body = {k: v for k, v in job.items() if k != "idempotency_key"}
        attempts = self._backoff.max_attempts
        last = ""
        for attempt in range(1, attempts + 1):
            retry_after: float | None = None
            try:
                answer = await self._http.post(
                    kind.route, json=body, headers={"Idempotency-Key": key}
                )
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if answer.status_code == 202:
                    data = answer.json()
                    return Sent(
                        id=str(data["id"]),
                        status=str(data["status"]),
                        replayed=answer.headers.get("Idempotent-Replayed") == "true",
                        idempotency_key=key,
                        attempts=attempt,
                    )
                if answer.status_code not in RETRIED_STATUSES:
                    raise Refused(answer.status_code, _body(answer))
                last = f"{answer.status_code} {_body(answer).get('error', '')}".strip()
                retry_after = retry_after_seconds(answer.headers.get("Retry-After"))
            if attempt < attempts:
                await self._sleep(self._backoff.delay(attempt, retry_after))
        raise GaveUp(attempts, last)


def _body(answer: httpx.Response) -> Mapping[str, Any]:
    try:
        data = answer.json()
    except ValueError:
        return {"error": answer.text[:200]}
    return data if isinstance(data, dict) else {"error": str(data)[:200]}
