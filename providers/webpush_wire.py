"""What goes on the Web Push wire for one push, and what its answer means.

The request (RFC 8030, 8291, 8292): a POST to the subscription's endpoint with
the payload encrypted for it (`Content-Encoding: aes128gcm`), `TTL`, `Urgency`
(from the job's priority), `Topic` (`SendIds.webpush_topic`: a pending message
with the same topic is replaced, the web's collapse key) and
`Authorization: vapid t=<JWT>, k=<our public key>`.

The plain payload is compact JSON a service worker reads with
`event.data.json()`: `{"title", "body", "data", "tag"}` (each only when set; `tag`
is the topic, for `showNotification`'s own collapsing, as FCM's notification tag).

Answers map to the error tree (see `providers.errors`):

```
2xx                      sent: the Location header (the message resource) is the id
404, 410                 InvalidDeviceToken: the subscription is gone, prune it
413                      PermanentProviderError PayloadTooLarge
400, 401, 403            ProviderConfigurationError: our VAPID key, its JWT or the
                         request we built was refused; no push is at fault
429, 5xx                 TransientProviderError, with Retry-After
any other                PermanentProviderError HTTP<status>
```
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from providers.errors import (
    InvalidDeviceToken,
    PermanentProviderError,
    ProviderConfigurationError,
    TransientProviderError,
    retry_after_seconds,
)
from providers.ids import WEBPUSH_TOPIC_MAX_CHARS, SendIds
from providers.provider import ProviderReceipt
from providers.push import Priority, Push

MAX_ENCRYPTED_BYTES = 4096
"""RFC 8030 7.2: a push service must take 4,096 bytes of encrypted payload; more may be 413."""

# aes128gcm (RFC 8188, 8291): a header of salt (16), record size (4), key id
# length (1) and our ephemeral public key (65); one record of the payload, its
# delimiter (1) and the AES-GCM tag (16). A payload that fits 4,096 bytes fits
# one record of the default 4,096-byte record size.
ENCRYPTION_OVERHEAD = 16 + 4 + 1 + 65 + 1 + 16
MAX_PLAIN_BYTES = MAX_ENCRYPTED_BYTES - ENCRYPTION_OVERHEAD
PAYLOAD_TOO_LARGE = "PayloadTooLarge"
CONFIGURATION_STATUSES = frozenset({400, 401, 403})
DEAD_SUBSCRIPTION = {404: "SubscriptionNotFound", 410: "SubscriptionGone"}
_PLACEHOLDER_TAG = "t" * WEBPUSH_TOPIC_MAX_CHARS  # the longest tag a topic can be


def webpush_payload(push: Push, *, tag: str) -> dict[str, Any]:
    note = push.notification
    payload: dict[str, Any] = {}
    if note.title is not None:
        payload["title"] = note.title
    if note.body is not None:
        payload["body"] = note.body
    if note.data:
        payload["data"] = dict(note.data)
    payload["tag"] = tag
    return payload


def webpush_body(push: Push, *, tag: str) -> bytes:
    """The plain payload: compact UTF-8 JSON (orjson; the standard library for what it refuses)."""
    payload = webpush_payload(push, tag=tag)
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def encrypted_size(plain_bytes: int) -> int:
    """The aes128gcm body's size for a plain payload of `plain_bytes` (one record)."""
    return plain_bytes + ENCRYPTION_OVERHEAD


def webpush_payload_problem(push: Push) -> str | None:
    """Why no push service need take `push` (too large once encrypted), or None.

    Asked before the send's ids exist (by the job parser and the door): the tag
    is counted at its longest, so what passes here fits when sent."""
    size = encrypted_size(len(webpush_body(push, tag=_PLACEHOLDER_TAG)))
    if size <= MAX_ENCRYPTED_BYTES:
        return None
    return (
        f"the Web Push payload would be {size:,} bytes encrypted;"
        f" push services take at most {MAX_ENCRYPTED_BYTES:,}"
    )


def webpush_headers(push: Push, ids: SendIds, *, default_ttl_seconds: int) -> dict[str, str]:
    """Every header but Authorization (see `providers.webpush`)."""
    ttl = push.ttl_seconds if push.ttl_seconds is not None else default_ttl_seconds
    headers = {
        "TTL": str(max(ttl, 0)),
        "Topic": ids.webpush_topic,
        "Content-Encoding": "aes128gcm",
        "Content-Type": "application/octet-stream",
    }
    if push.priority is not None:
        headers["Urgency"] = "high" if push.priority is Priority.HIGH else "normal"
    return headers


def webpush_result(
    status: int, headers: Mapping[str, str], text: str, *, provider: str
) -> ProviderReceipt:
    """The receipt of a 2xx, or raise the error its status means (module docstring)."""
    if 200 <= status < 300:
        location = headers.get("location") or f"no-location-{status}"
        return ProviderReceipt(provider=provider, provider_message_id=location)
    if status in DEAD_SUBSCRIPTION:
        raise InvalidDeviceToken(DEAD_SUBSCRIPTION[status], status=status, provider=provider)
    if status == 413:
        raise PermanentProviderError(PAYLOAD_TOO_LARGE, status=status, provider=provider)
    if status in CONFIGURATION_STATUSES:
        reason = " ".join(text.split())[:200] or f"HTTP{status}"
        raise ProviderConfigurationError(f"Refused: {reason}", status=status, provider=provider)
    if status == 429 or status >= 500:
        retry_after = retry_after_seconds(headers.get("retry-after"))
        raise TransientProviderError(
            f"HTTP{status}", status=status, provider=provider, retry_after=retry_after
        )
    raise PermanentProviderError(f"HTTP{status}", status=status, provider=provider)
