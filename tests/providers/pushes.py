"""Small builders of pushes for the provider tests."""

from __future__ import annotations

from providers import Notification, Platform, Priority, Push, SendIds, Target, send_ids


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


def ids_for(token: str, job: str = "order-1042-shipped") -> SendIds:
    return send_ids(job, token)
