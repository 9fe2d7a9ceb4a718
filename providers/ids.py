"""Deterministic send ids: the same job always sends with the same ids.

Every effect of a job's target carries one `effect_id`, a UUID5 of the job's dedupe
key and the target's address: APNs' apns-id, the webhook's `webhook-id`, the e-mail's
Message-ID, the idempotency key an API is called with. A resend (after a crash, with
the `resend` policy) carries the ids of the first attempt, so the device collapses a
duplicate push and a receiver dedupes a webhook. `effect_id` is per target (two
targets of one job never share one);
the collapse ids are per job (every device of a job collapses the same way).
"""

from __future__ import annotations

import base64
import hashlib
import re
import uuid
from dataclasses import dataclass

APNS_ID_NAMESPACE = uuid.UUID("c74a13a6-1eac-55e1-a09c-c2f131de515e")
"""uuid5(NAMESPACE_URL, ".../idempotent-workers/apns-id"), fixed: changing it changes every id."""
_NAMESPACE_BYTES = APNS_ID_NAMESPACE.bytes

COLLAPSE_ID_MAX_BYTES = 64
"""APNs rejects an apns-collapse-id longer than 64 bytes."""

WEBPUSH_TOPIC_MAX_CHARS = 32
"""RFC 8030: a Topic is at most 32 characters of the URL-safe base64 alphabet."""

_HEADER_SAFE = re.compile(r"[\x21-\x7e]*")
_NOT_HEADER_SAFE = re.compile(r"[^\x21-\x7e]+")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")
_DIGEST_CHARS = 43  # an unpadded base64url SHA-256
_READABLE_PREFIX_CHARS = COLLAPSE_ID_MAX_BYTES - _DIGEST_CHARS - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class SendIds:
    """The ids one push is sent with.

    effect_id         a UUID string, per target: APNs apns-id (echoed back as the provider
                      message id), webhook-id, Message-ID, Idempotency-Key
    collapse_id       <= 64 printable ASCII bytes: APNs apns-collapse-id, also sent by FCM
                      in apns.headers
    fcm_collapse_key  FCM android.collapse_key and android.notification.tag
    webpush_topic     <= 32 URL-safe base64 characters: the Web Push Topic header
    """

    effect_id: str
    collapse_id: str
    fcm_collapse_key: str
    webpush_topic: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobIds:
    """The ids every effect of one job shares; `for_address` adds a target's effect_id."""

    dedupe_key: str
    collapse_id: str
    webpush_topic: str

    def for_address(self, address: str) -> SendIds:
        return SendIds(
            effect_id=_uuid5(f"{self.dedupe_key}\0{address}"),
            collapse_id=self.collapse_id,
            fcm_collapse_key=self.collapse_id,
            webpush_topic=self.webpush_topic,
        )


def job_ids(dedupe_key: str, *, collapse_key: str | None = None) -> JobIds:
    """The collapse ids of one job, derived once for all its devices (see `send_ids`)."""
    source = collapse_key if collapse_key is not None else dedupe_key
    fits_header = bool(source) and len(source) <= COLLAPSE_ID_MAX_BYTES
    fits_header = fits_header and _HEADER_SAFE.fullmatch(source) is not None
    fits_topic = bool(source) and len(source) <= WEBPUSH_TOPIC_MAX_CHARS
    fits_topic = fits_topic and _BASE64URL.fullmatch(source) is not None
    digest = "" if fits_header and fits_topic else _digest(source)  # once, for both
    if fits_header:
        collapse_id = source
    else:  # a readable prefix and the hash
        collapse_id = f"{_NOT_HEADER_SAFE.sub('', source)[:_READABLE_PREFIX_CHARS]}~{digest}"
    return JobIds(
        dedupe_key=dedupe_key,
        collapse_id=collapse_id,
        webpush_topic=source if fits_topic else digest[:WEBPUSH_TOPIC_MAX_CHARS],
    )


def send_ids(dedupe_key: str, token: str, *, collapse_key: str | None = None) -> SendIds:
    """Derive the ids of one push from its job's dedupe key and its device token.

    The job's own `collapse_key`, when given, wins over the dedupe key for the
    collapse ids; either way a key that does not fit a limit is hashed to fit.
    A job's many devices: `job_ids(...)` once, then `.for_address(token)` each.
    """
    return job_ids(dedupe_key, collapse_key=collapse_key).for_address(token)


def _uuid5(name: str) -> str:
    """`str(uuid.uuid5(APNS_ID_NAMESPACE, name))`, without building a UUID object (a third
    of the cost of the ids, which every push pays)."""
    raw = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name.encode()).digest()[:16])
    raw[6] = raw[6] & 0x0F | 0x50  # version 5
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    x = raw.hex()
    return f"{x[:8]}-{x[8:12]}-{x[12:16]}-{x[16:20]}-{x[20:]}"


def _digest(key: str) -> str:
    raw = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
