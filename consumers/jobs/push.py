"""The push job format: one AMQP message, one notification, one or more devices.

    {
      "targets": [
        {"platform": "ios", "token": "..."},
        {"platform": "android", "token": "..."},
        {"platform": "web", "endpoint": "https://...", "keys": {"p256dh": "...", "auth": "..."}}
      ],
      "notification": {"title": "Shipped", "body": "On its way", "data": {"order": "1042"}},
      "priority": "high",            optional: high | normal
      "ttl_seconds": 3600,           optional
      "push_type": "alert",          optional: APNs apns-push-type
      "collapse_key": "order-1042"   optional: wins over the key derived from the message_id
    }

`push_job_body()` builds it on the publisher side. A job that does not parse
is dead-lettered as `invalid_push_job` with the reason in `x-error`. The send
API calls `parse_push_job` too, so what it answers 202 the worker attempts.
`PUSH` is the kind the send ledger's runner reads push jobs through
(`consumers.jobs.kind`): a job's devices are its recipients, in its order.

The rules a job must meet:

- no NUL (U+0000) in any text: PostgreSQL's text, where tokens and reasons
  are recorded, cannot hold it;
- a token is what APNs' `/3/device/{token}` path carries unchanged and what
  FCM's tokens are made of: RFC 3986 unreserved characters and `:` (APNs'
  own tokens are hex; FCM's letters, digits, `-`, `_` and `:`);
- a web target is a Web Push subscription as the browser gives it (endpoint and
  keys), checked by `providers.webpush_subscription` (https, a public host unless
  `allow_hosts` names it, keys of the right lengths); it becomes a `Target`
  whose token is the endpoint. A web target with a `token` instead is an FCM
  web registration token, sent through FCM as before;
- with a Web Push subscription among the targets, the payload must fit 4,096
  bytes once encrypted (`providers.webpush_wire`): refused here, with its size;
- `push_type` goes out as the `apns-push-type` header: printable ASCII;
- `ttl_seconds` from 0 to `MAX_TTL_SECONDS` (about 68 years).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Self

import asyncpg

from consumers.jobs.kind import DeadTarget, InvalidJob, Recipient
from consumers.message.envelope import loads_json
from consumers.settings import MAX_BODY_BYTES, Settings
from dedupe import DbConnection
from providers import Notification, Platform, Priority, Push, Target, WebPushKeys
from providers.apns_wire import apns_body, payload_limit
from providers.webpush_subscription import subscription_problem
from providers.webpush_wire import webpush_payload_problem

MAX_TARGETS = 500  # devices of one job (one AMQP message); more: consumers.publishing.parts
MAX_AUDIENCE = 100_000  # devices of one send, split into parts (consumers.publishing.parts)
MAX_TOKEN_CHARS = 4096
MAX_TTL_SECONDS = 2**31 - 1
# A job is one AMQP message: at most what a worker decodes by default. The send
# API takes a larger body from no one (IW_MAX_BODY_BYTES moves both).
MAX_JOB_BYTES = MAX_BODY_BYTES
# The send API's schema states the same rules with these patterns.
TOKEN_PATTERN = r"[A-Za-z0-9._~:-]+"
HEADER_TEXT_PATTERN = r"[!-~]([ -~]*[!-~])?"
_TOKEN = re.compile(TOKEN_PATTERN)
_HEADER_TEXT = re.compile(HEADER_TEXT_PATTERN)


class InvalidPushJob(InvalidJob):
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
    allow_hosts: Set[str] = frozenset(),
) -> dict[str, Any]:
    """The JSON body of a push job (publish it with a stable message_id).

    `allow_hosts`: Web Push endpoint hosts the workers allow (tests, demos)."""
    job: dict[str, Any] = {
        "targets": [target_json(t) for t in targets],
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
    parse_push_job(job, allow_hosts=allow_hosts)  # refuse what a worker would dead-letter
    return job


def target_json(target: Target) -> dict[str, Any]:
    """A target as a job carries it: a token, or a Web Push subscription's endpoint and keys."""
    if target.keys is None:
        return {"platform": str(target.platform), "token": target.token}
    keys = {"p256dh": target.keys.p256dh, "auth": target.keys.auth}
    return {"platform": str(target.platform), "endpoint": target.token, "keys": keys}


def apns_payload_problem(job: PushJob) -> str | None:
    """Why APNs would refuse every iOS push of `job` (its payload is too large), or None.

    The send API asks it at the door; a job published straight to the queue
    meets the same rule in `ApnsProvider.send` (PayloadTooLarge, device by device).
    """
    ios = next((t for t in job.targets if t.platform is Platform.IOS), None)
    if ios is None:
        return None
    push = job.push_for(ios)
    size, limit = len(apns_body(push)), payload_limit(push.effective_push_type)
    if size <= limit:
        return None
    return f"the APNs payload would be {size:,} bytes; APNs takes at most {limit:,}"


def devices_named(body: bytes, *, max_body_bytes: int) -> int:
    """The devices a delivered job's body names, read before its batch decodes it.

    Its `targets`' length (repeated devices fold later: never an undercount);
    1 for a body the batch will refuse (too large, not JSON, no list)."""
    if len(body) > max_body_bytes:
        return 1
    try:
        value = loads_json(body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested past the stack
        return 1
    targets = value.get("targets") if isinstance(value, dict) else None
    return max(1, len(targets)) if isinstance(targets, list) else 1


def parse_push_job(
    body: Mapping[str, Any],
    *,
    max_targets: int = MAX_TARGETS,
    allow_hosts: Set[str] = frozenset(),
) -> PushJob:
    """Parse and validate a push job body; raise `InvalidPushJob` saying what is wrong.

    `max_targets`: MAX_TARGETS for one job, MAX_AUDIENCE for a send split into parts.
    `allow_hosts`: Web Push endpoint hosts exempt from the public-host rule
    (`WorkerSettings.webpush_allow_hosts`; empty in production)."""
    raw_targets = body.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise InvalidPushJob("targets: a non-empty list is required")
    if len(raw_targets) > max_targets:
        raise InvalidPushJob(f"targets: at most {max_targets}")
    targets: list[Target] = []
    seen: dict[tuple[Platform, str], Target] = {}
    for n, raw in enumerate(raw_targets):
        target = _target(n, raw, allow_hosts)
        first = seen.setdefault((target.platform, target.token), target)
        if first is target:  # one device twice in a job gets one push
            targets.append(target)
        elif first != target:
            raise InvalidPushJob(f"targets[{n}]: the same endpoint as before, with other keys")
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
    for field, value in (("notification.title", title), ("notification.body", text)):
        _no_nul(value, field)
    for key, value in data.items():
        _no_nul(key, "notification.data")
        _no_nul(value, f"notification.data.{key}")
    priority = body.get("priority")
    if priority is not None and priority not in ("high", "normal"):
        raise InvalidPushJob("priority: high or normal")
    ttl = body.get("ttl_seconds")
    if ttl is not None and (
        not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= MAX_TTL_SECONDS
    ):
        raise InvalidPushJob(f"ttl_seconds: an integer from 0 to {MAX_TTL_SECONDS}")
    for name in ("push_type", "collapse_key"):
        value = body.get(name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidPushJob(f"{name}: a non-empty string")
        _no_nul(value, name)
    push_type = body.get("push_type")
    if push_type is not None and not _HEADER_TEXT.fullmatch(push_type):
        raise InvalidPushJob("push_type: printable ASCII (it is the apns-push-type header)")
    job = PushJob(
        targets=tuple(targets),
        notification=Notification(title=title, body=text, data=data),
        priority=None if priority is None else Priority(priority),
        ttl_seconds=ttl,
        push_type=body.get("push_type"),
        collapse_key=body.get("collapse_key"),
    )
    web = next((t for t in job.targets if t.is_webpush), None)
    if web is not None and (problem := webpush_payload_problem(job.push_for(web))) is not None:
        raise InvalidPushJob(f"notification: {problem}")
    return job


def _target(n: int, raw: object, allow_hosts: Set[str]) -> Target:
    """targets[n] of a job: a device token, or a Web Push subscription."""
    if not isinstance(raw, dict):
        raise InvalidPushJob(f"targets[{n}]: an object is required")
    try:
        platform = Platform(str(raw.get("platform")))
    except ValueError:
        raise InvalidPushJob(f"targets[{n}].platform: one of ios, android, web") from None
    if platform is Platform.WEB and "token" in raw and ("endpoint" in raw or "keys" in raw):
        raise InvalidPushJob(
            f"targets[{n}]: a web target has a token (FCM) or an endpoint and keys, not both"
        )
    if platform is Platform.WEB and "token" not in raw:
        endpoint, keys = raw.get("endpoint"), raw.get("keys")
        problem = subscription_problem(endpoint, keys, allow_hosts=allow_hosts)
        if problem is not None:
            raise InvalidPushJob(f"targets[{n}].{problem}")
        assert isinstance(endpoint, str) and isinstance(keys, dict)
        web_keys = WebPushKeys(p256dh=keys["p256dh"], auth=keys["auth"])
        return Target(platform=platform, token=endpoint, keys=web_keys)
    token = raw.get("token")
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS:
        raise InvalidPushJob(f"targets[{n}].token: 1 to {MAX_TOKEN_CHARS} characters")
    if not _TOKEN.fullmatch(token):
        raise InvalidPushJob(f"targets[{n}].token: letters, digits and -._~:")
    return Target(platform=platform, token=token)


def _no_nul(value: str | None, field: str) -> None:
    if value is not None and "\x00" in value:
        raise InvalidPushJob(f"{field}: no NUL (U+0000) character")


class PushKind:
    """Push jobs as the send ledger's runner reads them (`consumers.jobs.kind`).

    A device's channel is its platform, or `webpush` for a Web Push subscription
    (`providers.Target.channel`); bound to a worker, the kind allows the Web Push
    hosts its settings allow (`WorkerSettings.webpush_allow_hosts`)."""

    name = "push"

    def __init__(self, *, allow_hosts: frozenset[str] = frozenset()) -> None:
        self.allow_hosts = allow_hosts

    def bound(self, pool: asyncpg.Pool, settings: Settings) -> Self:
        return type(self)(allow_hosts=settings.worker.webpush_allow_hosts)

    def parse(self, body: Mapping[str, Any]) -> PushJob:
        return parse_push_job(body, allow_hosts=self.allow_hosts)

    def weigh(self, body: bytes, *, max_body_bytes: int) -> int:
        return devices_named(body, max_body_bytes=max_body_bytes)

    def collapse_key(self, job: PushJob) -> str | None:
        return job.collapse_key

    async def recipients(
        self, tx: DbConnection, jobs: Sequence[tuple[str, PushJob]]
    ) -> list[list[Recipient]]:
        return [
            [Recipient(channel=t.channel, address=t.token) for t in job.targets] for _, job in jobs
        ]

    async def effect(self, job: PushJob, index: int, recipient: Recipient, *, tenant: str) -> Push:
        return job.push_for(job.targets[index])

    async def gone(self, tx: DbConnection, dead: DeadTarget) -> None:
        """Nothing of ours: the app's `on_invalid_token` prunes the device."""


PUSH = PushKind()
