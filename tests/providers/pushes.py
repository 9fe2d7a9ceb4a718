"""The pushes the provider tests send, a send that returns its error instead of raising,
and the APNs push app and waits of the worker-level push tests."""

from __future__ import annotations

from consumers import App
from dedupe import DbConnection
from providers import (
    ApnsProvider,
    Notification,
    Platform,
    Priority,
    Provider,
    ProviderError,
    ProviderReceipt,
    Push,
    SendIds,
    Target,
    send_ids,
)
from providers.fakes.apns import FakeApns
from tests.apps.push_app import FAST_RETRY

JOB = "order-1042-shipped"


def push_to(
    token: str,
    platform: Platform = Platform.IOS,
    *,
    priority: Priority | None = None,
    ttl_seconds: int | None = None,
    collapse_key: str | None = None,
) -> Push:
    """A visible notification to one device."""
    note = Notification(title="Your order shipped", body="It arrives Friday", data={"order": "1"})
    return Push(
        target=Target(platform=platform, token=token),
        notification=note,
        priority=priority,
        ttl_seconds=ttl_seconds,
        collapse_key=collapse_key,
    )


def fcm_push(token: str, platform: Platform = Platform.ANDROID) -> Push:
    """What goes through FCM most: high priority, kept an hour."""
    return push_to(token, platform, priority=Priority.HIGH, ttl_seconds=3600)


def ids_for(token: str, job: str = JOB) -> SendIds:
    return send_ids(job, token)


async def send_or_error(provider: Provider, push: Push) -> ProviderReceipt | ProviderError:
    """The receipt, or the ProviderError the send raised: tests compare both kinds."""
    try:
        return await provider.send(push, ids_for(push.target.token))
    except ProviderError as exc:
        return exc


def apns_push_app(queue: str, fake: FakeApns, *, timeout: float) -> App:
    """A push handler on `queue` sending to `fake` with this provider timeout."""
    app = App(retry=FAST_RETRY)

    async def provider() -> Provider:
        return ApnsProvider(fake.settings(timeout_seconds=timeout))

    app.push_handler(queue, provider=provider, lease_seconds=30.0)
    return app


async def requested(fake: FakeApns, n: int) -> bool:
    """The fake read at least `n` requests."""
    return len(fake.requests) >= n


async def sent(db: DbConnection, n: int) -> bool:
    """At least `n` ledger rows are `sent`."""
    done = await db.fetchval("SELECT count(*) FROM send_ledger WHERE status = 'sent'")
    return bool(done >= n)
