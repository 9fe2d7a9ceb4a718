"""The push job format: one AMQP message, one notification, one or more devices.

    {
      "targets": [{"platform": "ios", "token": "..."}, {"platform": "android", "token": "..."}],
      "notification": {"title": "Shipped", "body": "On its way", "data": {"order": "1042"}},
      "priority": "high",            optional: high | normal
      "ttl_seconds": 3600,           optional
      "push_type": "alert",          optional: APNs apns-push-type
      "collapse_key": "order-1042"   optional: wins over the key derived from the message_id
    }

`push_job_body()` builds it on the publisher side. A job that does not parse
is dead-lettered as `invalid_push_job` with the reason in `x-error`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers import Notification, Platform, Priority, Push, Target

MAX_TARGETS = 500
MAX_TOKEN_CHARS = 4096


class InvalidPushJob(ValueError):
    """The body is not a push job; the message says which field is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PushJob:
    targets: tuple[Target, ...]  # distinct; a target's index is its position here
    notification: Notification
    priority: Priority | None = None
    ttl_seconds: int | None = None
    push_type: str | None = None
    collapse_key: str | None = None

    def push_for(self, target: Target) -> Push:
        return Push(
            target=target,
            notification=self.notification,
            priority=self.priority,
            ttl_seconds=self.ttl_seconds,
            push_type=self.push_type,
            collapse_key=self.collapse_key,
        )


def push_job_body(
    *,
    targets: Sequence[Target],
    title: str | None = None,
    body: str | None = None,
    data: Mapping[str, str] | None = None,
    priority: Priority | None = None,
    ttl_seconds: int | None = None,
    push_type: str | None = None,
    collapse_key: str | None = None,
) -> dict[str, Any]:
    """The JSON body of a push job (publish it with a stable message_id)."""
    job: dict[str, Any] = {
        "targets": [{"platform": str(t.platform), "token": t.token} for t in targets],
        "notification": {
            k: v
            for k, v in (("title", title), ("body", body), ("data", dict(data or {})))
            if v is not None
        },
    }
    for name, value in (
        ("priority", None if priority is None else str(priority)),
        ("ttl_seconds", ttl_seconds),
        ("push_type", push_type),
        ("collapse_key", collapse_key),
    ):
        if value is not None:
            job[name] = value
    parse_push_job(job)  # refuse to build what a worker would dead-letter
    return job


def parse_push_job(body: Mapping[str, Any]) -> PushJob:
    """Parse and validate a push job body; raise `InvalidPushJob` saying what is wrong."""
    raw_targets = body.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise InvalidPushJob("targets: a non-empty list is required")
    if len(raw_targets) > MAX_TARGETS:
        raise InvalidPushJob(f"targets: at most {MAX_TARGETS}")
    targets: list[Target] = []
    for n, raw in enumerate(raw_targets):
        if not isinstance(raw, dict):
            raise InvalidPushJob(f"targets[{n}]: an object is required")
        try:
            platform = Platform(str(raw.get("platform")))
        except ValueError:
            raise InvalidPushJob(f"targets[{n}].platform: one of ios, android, web") from None
        token = raw.get("token")
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
            raise InvalidPushJob(f"targets[{n}].token: 1 to {MAX_TOKEN_CHARS} characters")
        target = Target(platform=platform, token=token)
        if target not in targets:  # one device twice in a job gets one push
            targets.append(target)
    raw_note = body.get("notification", {})
    if not isinstance(raw_note, dict):
        raise InvalidPushJob("notification: an object is required")
    title, text, data = raw_note.get("title"), raw_note.get("body"), raw_note.get("data", {})
    if title is not None and not isinstance(title, str):
        raise InvalidPushJob("notification.title: a string")
    if text is not None and not isinstance(text, str):
        raise InvalidPushJob("notification.body: a string")
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise InvalidPushJob("notification.data: an object of strings")
    priority = body.get("priority")
    if priority is not None and priority not in ("high", "normal"):
        raise InvalidPushJob("priority: high or normal")
    ttl = body.get("ttl_seconds")
    if ttl is not None and (not isinstance(ttl, int) or isinstance(ttl, bool) or ttl < 0):
        raise InvalidPushJob("ttl_seconds: a non-negative integer")
    for name in ("push_type", "collapse_key"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidPushJob(f"{name}: a non-empty string")
    return PushJob(
        targets=tuple(targets),
        notification=Notification(title=title, body=text, data=data),
        priority=None if priority is None else Priority(priority),
        ttl_seconds=ttl,
        push_type=body.get("push_type"),
        collapse_key=body.get("collapse_key"),
    )
