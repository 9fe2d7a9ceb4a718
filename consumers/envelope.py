"""Decode an AMQP delivery into an Envelope, or say why it is bad input.

The message contract: `message_id` property (required, at most 128 bytes, the
dedupe key), optional `x-tenant` header, a JSON object body, an `x-attempt`
header the framework sets on retries. Anything else is bad input and gets a
reason string; bad input is dead-lettered at once, never retried.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import aio_pika
import orjson

from dedupe import DedupeKey, fingerprint, is_plain

MAX_MESSAGE_ID_BYTES = 128
TENANT_HEADER = "x-tenant"
ATTEMPT_HEADER = "x-attempt"
REASON_HEADER = "x-reason"
# aiormq gives any message published without a message_id a random one; when we
# move such a message to a dead-letter queue this header keeps it marked as
# having none, so a replay cannot run it under an invented key.
NO_MESSAGE_ID_HEADER = "x-no-message-id"

Fingerprinter = Callable[[Mapping[str, Any]], bytes]


class BadInput(StrEnum):
    BODY_TOO_LARGE = "body_too_large"
    INVALID_JSON = "invalid_json"
    BODY_NOT_OBJECT = "body_not_json_object"
    MISSING_MESSAGE_ID = "missing_message_id"
    MESSAGE_ID_TOO_LONG = "message_id_too_long"
    BAD_TENANT = "bad_tenant"
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"


@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    key: DedupeKey
    body: Mapping[str, Any]
    fingerprint: bytes
    attempt: int

    @property
    def message_id(self) -> str:
        return self.key.message_id

    @property
    def tenant(self) -> str:
        return self.key.tenant


def loads_plain(raw: bytes) -> tuple[Any, bool]:
    """`json.loads(raw)`, through orjson when that gives the same value (~5x
    faster), and whether the value is plain (`dedupe.is_plain`).

    orjson refuses what the standard library is lenient about (NaN, 1e400,
    lone surrogates, UTF-16), and reads ints past 64 bits as floats. So a body
    orjson refuses, or whose value holds a float, is read again by the
    standard library, which has the last word: what is valid JSON, and its
    value, do not change. The type walk that tells is the one the fingerprint
    needs anyway.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw), False
    if is_plain(value):
        return value, True
    return json.loads(raw), False


def loads_json(raw: bytes) -> Any:
    """`json.loads(raw)`, through orjson where that gives the same value."""
    return loads_plain(raw)[0]


def attempt_of(message: aio_pika.abc.AbstractIncomingMessage) -> int:
    raw = (message.headers or {}).get(ATTEMPT_HEADER, 1)
    return max(raw, 1) if isinstance(raw, int) and not isinstance(raw, bool) else 1


def decode(
    message: aio_pika.abc.AbstractIncomingMessage,
    *,
    consumer: str,
    max_body_bytes: int,
    fingerprinter: Fingerprinter | None = None,
) -> Envelope | BadInput:
    """The envelope of `message`, or the reason it cannot be processed."""
    if len(message.body) > max_body_bytes:
        return BadInput.BODY_TOO_LARGE
    content_type = message.content_type
    if content_type and not content_type.startswith("application/json"):
        return BadInput.UNSUPPORTED_CONTENT_TYPE
    message_id = message.message_id
    if not message_id or (message.headers or {}).get(NO_MESSAGE_ID_HEADER):
        return BadInput.MISSING_MESSAGE_ID
    if len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
        return BadInput.MESSAGE_ID_TOO_LONG
    tenant = (message.headers or {}).get(TENANT_HEADER, "")
    if isinstance(tenant, bytes):
        tenant = tenant.decode(errors="replace")
    if not isinstance(tenant, str) or len(tenant.encode()) > MAX_MESSAGE_ID_BYTES:
        return BadInput.BAD_TENANT
    try:
        body, plain = loads_plain(message.body)
    except (ValueError, UnicodeDecodeError):
        return BadInput.INVALID_JSON
    if not isinstance(body, dict):
        return BadInput.BODY_NOT_OBJECT
    try:
        digest = fingerprinter(body) if fingerprinter else fingerprint(body, plain=plain)
    except ValueError:  # NaN or Infinity: not JSON we can compare
        return BadInput.INVALID_JSON
    return Envelope(
        key=DedupeKey(consumer=consumer, tenant=tenant, message_id=message_id),
        body=body,
        fingerprint=digest,
        attempt=attempt_of(message),
    )
