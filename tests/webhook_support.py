"""What the webhook tests share: a key, endpoints made as the CLI makes them, the ledger."""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.fernet import Fernet

from consumers import App, RetryPolicy, WebhookSettings
from consumers.effects.answers import dedupe_key_text
from consumers.jobs.webhook_endpoints import secret_box
from dedupe import DbConnection, DedupeKey, WebhookEndpoints
from providers import send_ids, webhook_id
from providers.fakes.webhooks import WebhookReceiver

KEY = Fernet.generate_key().decode()
LOCAL = frozenset({"127.0.0.1"})
# Backoff over short tiers: a retry comes back within a second or two.
RETRY = RetryPolicy(max_attempts=5, base_seconds=0.2, tiers_seconds=(0.2, 0.5, 1.0, 2.0))


def webhook_settings(*, timeout: float = 2.0, cache: float = 0.5) -> WebhookSettings:
    """A queue's settings: the key comes from the worker's (the test's `Settings`)."""
    return WebhookSettings(
        allow_http_hosts=LOCAL,
        timeout_seconds=timeout,
        connect_timeout_seconds=min(1.0, timeout),
        endpoint_cache_seconds=cache,
    )


def webhook_app(queue: str, *, timeout: float = 2.0, cache: float = 0.5) -> App:
    app = App(retry=RETRY)
    app.webhook_handler(
        queue,
        settings=webhook_settings(timeout=timeout, cache=cache),
        lease_seconds=max(4.0, timeout * 2),
    )
    return app


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    id: str
    path: str
    secret: str


async def add_endpoint(
    db: DbConnection,
    schema: str,
    receiver: WebhookReceiver,
    path: str,
    *,
    tenant: str = "acme",
    event_types: tuple[str, ...] = (),
) -> Endpoint:
    """An endpoint at `path` of the receiver, which trusts its secret."""
    endpoint, secret = await WebhookEndpoints(schema).add(
        db, tenant=tenant, url=receiver.url(path), event_types=event_types, box=secret_box((KEY,))
    )
    receiver.trust(path, secret)
    return Endpoint(id=endpoint.id, path=path, secret=secret)


def expected_id(queue: str, tenant: str, message_id: str, endpoint: Endpoint) -> str:
    """The webhook-id a job's call to `endpoint` carries, derived as the ledger does."""
    key = DedupeKey(consumer=queue, tenant=tenant, message_id=message_id)
    return webhook_id(send_ids(dedupe_key_text(key), endpoint.id))


async def ledger(db: DbConnection) -> list[dict[str, object]]:
    rows = await db.fetch(
        "SELECT message_id, address, status, sends, provider_message_id, failure_reason"
        " FROM send_ledger ORDER BY message_id, target_index"
    )
    return [dict(r) for r in rows]


async def settled(db: DbConnection, n: int) -> bool:
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status IN ('sent', 'failed')")
    return bool(done >= n)
