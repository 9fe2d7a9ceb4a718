"""The webhook job format: one AMQP message, one event, sent to the tenant's endpoints.

    {
      "event_type": "order.shipped",
      "payload": {"order": "1042"},            any JSON: the event's data
      "timestamp": "2026-03-01T12:00:00Z",     optional: when the event happened (ISO 8601)
      "endpoints": ["ep_3f9a..."]              optional: these of the tenant's endpoints
    }

Each endpoint gets the Standard Webhooks payload, `{"type": event_type, "timestamp":
timestamp, "data": payload}` (no `timestamp` key when the job has none), serialised
once when the job is read, so every attempt sends, and signs, the same bytes.
`webhook_job_body()` builds a job on the publisher side and sets `timestamp` to the
time it is built unless given; a job that does not parse is dead-lettered as
`invalid_webhook_job`.

Whom it goes to (`WebhookKind.recipients`, once, in the claim's transaction): the
tenant's enabled endpoints that take the event type (an endpoint that names none
takes every one), or, with `endpoints`, those of them that are the tenant's and
enabled, whatever event types they take. A job with no endpoint at all is committed
with nothing sent (`webhook_without_endpoint` is logged). Each endpoint is a row of
the send ledger (channel `webhook`, address its id), and its `webhook-id` is derived
from the job's dedupe key and that id (`providers.webhook_id`).

The rules a job must meet: `event_type` is dot-separated names of letters, digits,
`_` and `-` (what an endpoint subscribes to), at most 200 characters; an endpoint id
is `ep_` and letters, digits, `_`, `-`; at most MAX_ENDPOINTS of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Self

import asyncpg
import structlog

from consumers.jobs.kind import DeadTarget, InvalidJob, Recipient
from consumers.jobs.webhook_endpoints import SigningReads, secret_box, url_problem
from consumers.message.decisions import ConfigurationError
from consumers.message.envelope import loads_json
from consumers.settings import Settings, WebhookSettings
from dedupe import DbConnection, Subscription, WebhookEndpoints
from providers import (
    PermanentProviderError,
    Sender,
    TargetGone,
    WebhookCall,
)

log = structlog.get_logger(__name__)

CHANNEL = "webhook"
MAX_ENDPOINTS = 100
MAX_EVENT_TYPE_CHARS = 200
EVENT_TYPE_PATTERN = r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*"
ENDPOINT_ID_PATTERN = r"ep_[A-Za-z0-9_-]{1,100}"
_EVENT_TYPE = re.compile(EVENT_TYPE_PATTERN)
_ENDPOINT_ID = re.compile(ENDPOINT_ID_PATTERN)


class InvalidWebhookJob(InvalidJob):
    """The body is not a webhook job; the message says which field is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookJob:
    event_type: str
    body: bytes = field(repr=False)  # the payload every attempt sends, byte for byte
    endpoints: tuple[str, ...] | None = None  # None: every endpoint taking event_type


def webhook_job_body(
    *,
    event_type: str,
    payload: Any,
    timestamp: datetime | str | None = None,
    endpoints: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The JSON body of a webhook job (publish it, or `ctx.emit` it, with a stable
    message_id); `timestamp` defaults to now, so a redelivery sends the same body."""
    when = datetime.now(UTC) if timestamp is None else timestamp
    if isinstance(when, datetime):
        when = when.isoformat().replace("+00:00", "Z")
    job: dict[str, Any] = {"event_type": event_type, "payload": payload, "timestamp": when}
    if endpoints is not None:
        job["endpoints"] = list(endpoints)
    parse_webhook_job(job)  # refuse to build what a worker would dead-letter
    return job


def is_event_type(text: str) -> bool:
    """What an event type may be: a job's `event_type`, an endpoint's subscription."""
    return 0 < len(text) <= MAX_EVENT_TYPE_CHARS and _EVENT_TYPE.fullmatch(text) is not None


def parse_webhook_job(body: Mapping[str, Any]) -> WebhookJob:
    """Parse and validate a webhook job body; raise `InvalidWebhookJob` saying what is wrong."""
    event_type = body.get("event_type")
    if not isinstance(event_type, str) or not is_event_type(event_type):
        raise InvalidWebhookJob(
            f"event_type: dot-separated names of letters, digits, _ and -,"
            f" at most {MAX_EVENT_TYPE_CHARS} characters"
        )
    if "payload" not in body:
        raise InvalidWebhookJob("payload: required (any JSON)")
    timestamp = body.get("timestamp")
    if timestamp is not None:
        if not isinstance(timestamp, str):
            raise InvalidWebhookJob("timestamp: an ISO 8601 string")
        try:
            datetime.fromisoformat(timestamp)
        except ValueError:
            raise InvalidWebhookJob("timestamp: an ISO 8601 date and time") from None
    endpoints = body.get("endpoints")
    if endpoints is not None:
        if not isinstance(endpoints, list) or not endpoints:
            raise InvalidWebhookJob("endpoints: a non-empty list of endpoint ids, or absent")
        if len(endpoints) > MAX_ENDPOINTS:
            raise InvalidWebhookJob(f"endpoints: at most {MAX_ENDPOINTS}")
        for n, endpoint in enumerate(endpoints):
            if not isinstance(endpoint, str) or not _ENDPOINT_ID.fullmatch(endpoint):
                raise InvalidWebhookJob(f"endpoints[{n}]: an endpoint id (ep_...)")
        endpoints = tuple(dict.fromkeys(endpoints))  # one call per endpoint, in order
    return WebhookJob(
        event_type=event_type,
        body=_payload(event_type, timestamp, body["payload"]),
        endpoints=endpoints,
    )


def _payload(event_type: str, timestamp: str | None, data: Any) -> bytes:
    """The Standard Webhooks payload, compact JSON, UTF-8."""
    sent: dict[str, Any] = {"type": event_type}
    if timestamp is not None:
        sent["timestamp"] = timestamp
    sent["data"] = data
    try:
        return json.dumps(sent, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:  # before ValueError, its base
        raise InvalidWebhookJob("payload: no lone surrogate (it cannot be UTF-8)") from None
    except (ValueError, TypeError, RecursionError):
        raise InvalidWebhookJob("payload: JSON that can be sent (no NaN, no infinity)") from None


def endpoints_named(body: bytes, *, max_body_bytes: int) -> int:
    """The calls a delivered job asks for, read before its batch decodes it: the endpoints
    it names, or 1 (a tenant's endpoints are known only at its claim)."""
    if len(body) > max_body_bytes:
        return 1
    try:
        value = loads_json(body)
    except (ValueError, RecursionError):
        return 1
    named = value.get("endpoints") if isinstance(value, dict) else None
    return max(1, len(named)) if isinstance(named, list) else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class _Bound:
    """What a worker gives the kind (`bound`): its settings, where endpoints live."""

    settings: WebhookSettings
    store: WebhookEndpoints
    signing: SigningReads


class WebhookKind:
    """Webhook jobs as the send ledger's runner reads them (`consumers.jobs.kind`).

    `settings`: the queue's (`App.webhook_handler`); None: the worker's
    (`Settings.webhooks`). With either, the key is the worker's when the given
    settings have none (IW_WEBHOOK_SECRETS_KEY)."""

    name = "webhook"

    def __init__(self, settings: WebhookSettings | None = None, *, bound: _Bound | None = None):
        self.settings = settings
        self._bound = bound

    def bound(self, pool: asyncpg.Pool, settings: Settings) -> Self:
        """This kind on a worker's pool, with its key: `ConfigurationError` without one."""
        mine = self.settings or settings.webhooks
        box = secret_box(mine.secrets_keys or settings.webhooks.secrets_keys)
        store = WebhookEndpoints(settings.database.schema)
        signing = SigningReads(pool, store, box, cache_seconds=mine.endpoint_cache_seconds)
        return type(self)(self.settings, bound=_Bound(settings=mine, store=store, signing=signing))

    @property
    def _worker(self) -> _Bound:
        if self._bound is None:
            raise ConfigurationError("a WebhookKind reads endpoints only once bound to a worker")
        return self._bound

    def parse(self, body: Mapping[str, Any]) -> WebhookJob:
        return parse_webhook_job(body)

    def weigh(self, body: bytes, *, max_body_bytes: int) -> int:
        return endpoints_named(body, max_body_bytes=max_body_bytes)

    def collapse_key(self, job: WebhookJob) -> str | None:
        return None  # a receiver dedupes by webhook-id: no collapse id

    async def recipients(
        self, tx: DbConnection, jobs: Sequence[tuple[str, WebhookJob]]
    ) -> list[list[Recipient]]:
        """Each job's endpoints (see the module docstring): one statement for the batch."""
        found = await self._worker.store.subscriptions(tx, [tenant for tenant, _ in jobs])
        of_tenant: dict[str, list[Subscription]] = {}
        for subscription in found:
            of_tenant.setdefault(subscription.tenant, []).append(subscription)
        chosen: list[list[Recipient]] = []
        for tenant, job in jobs:
            enabled = of_tenant.get(tenant, [])
            if job.endpoints is None:
                ids = [s.id for s in enabled if s.takes(job.event_type)]
            else:
                known = {s.id for s in enabled}
                ids = [e for e in job.endpoints if e in known]
                if len(ids) < len(job.endpoints):
                    log.warning(
                        "webhook_endpoints_skipped",
                        tenant=tenant,
                        event_type=job.event_type,
                        endpoints=[e for e in job.endpoints if e not in known],
                        reason="not an enabled endpoint of the tenant",
                    )
            if not ids:
                log.info("webhook_without_endpoint", tenant=tenant, event_type=job.event_type)
            chosen.append([Recipient(channel=CHANNEL, address=i) for i in ids])
        return chosen

    async def effect(
        self, job: WebhookJob, index: int, recipient: Recipient, *, tenant: str
    ) -> WebhookCall:
        """The call to one endpoint: its URL and live secrets now (cached a few seconds)."""
        endpoint = await self._worker.signing.read(recipient.address)
        if endpoint is None:
            raise TargetGone("endpoint_removed", provider=self.name)
        if endpoint.disabled_reason is not None:
            raise TargetGone(f"endpoint_disabled: {endpoint.disabled_reason}", provider=self.name)
        allowed = self._worker.settings.allow_http_hosts
        if (problem := url_problem(endpoint.url, allowed)) is not None:
            raise PermanentProviderError(f"url_refused: {problem}", provider=self.name)
        if not endpoint.secrets:
            raise PermanentProviderError("no_live_secret: rotate the endpoint", provider=self.name)
        return WebhookCall(url=endpoint.url, body=job.body, secrets=endpoint.secrets)

    async def gone(self, tx: DbConnection, dead: DeadTarget) -> None:
        """The endpoint answered 410 Gone: disable it, in the recording transaction."""
        worker = self._worker
        worker.signing.forget(dead.address)
        if await worker.store.disable(tx, dead.address, reason=dead.reason):
            log.warning(
                "webhook_endpoint_disabled",
                tenant=dead.tenant,
                endpoint=dead.address,
                reason=dead.reason,
                message_id=dead.message_id,
            )


def webhook_sender(settings: WebhookSettings | None) -> Callable[[], Awaitable[Sender[Any]]]:
    """What builds a webhook queue's sender inside the worker's loop (the `webhooks`
    extra's httpx and standardwebhooks are imported only then)."""
    given = settings or WebhookSettings()

    async def build() -> Sender[Any]:
        from providers.webhooks import WebhookSender

        return WebhookSender(
            timeout_seconds=given.timeout_seconds,
            connect_timeout_seconds=given.connect_timeout_seconds,
            max_in_flight=given.max_in_flight,
        )

    return build
