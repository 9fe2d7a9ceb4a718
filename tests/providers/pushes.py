"""The pushes the provider tests send, and a send that returns its error instead of raising."""

from __future__ import annotations

from providers import (
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
