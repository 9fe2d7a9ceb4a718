"""Decode an AMQP delivery into an Envelope, or say why it is bad input.

The message contract: `message_id` property (required, at most 128 bytes, the
dedupe key), optional `x-tenant` header, a JSON object body, an `x-attempt`
header the framework sets on retries. Anything else is bad input and gets a
reason string; bad input is dead-lettered at once, never retried.

Everything a message can do wrong outside the handler is found here, for that
message alone: a key PostgreSQL would refuse (NUL) or that is not UTF-8 (never
replaced: `b"\xff"` and `b"\xfe"` must not become one tenant), JSON nested
deeper than `MAX_JSON_DEPTH` (the parser would recurse out of stack), a
content type other than JSON, a content encoding that names a transform, a
custom fingerprint function that raises. `decode` returns; it never raises.

A JSON body is UTF-8 text (RFC 8259), so a charset that says UTF-8, in any
spelling, is accepted where other clients put it: kombu's JSON serializer
and many pika users set `content_encoding='utf-8'`, others
`content_type='application/json; charset=utf-8'`. A content encoding that
names a real transform (gzip, deflate, binary) or another charset, and
kombu's `compression` header, stay `unsupported_content_encoding`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson
from aio_pika.abc import HeadersType

from dedupe import DedupeKey, fingerprint, is_plain

MAX_MESSAGE_ID_BYTES = 128
MAX_ATTEMPT = 1_000_000  # an x-attempt above is read as this
MAX_JSON_DEPTH = 100  # nested objects and arrays; deeper is bad input
JSON_MEDIA_TYPE = "application/json"
TENANT_HEADER = "x-tenant"
ATTEMPT_HEADER = "x-attempt"
# kombu's `compression=` keeps content_encoding 'utf-8' and names the transform here.
KOMBU_COMPRESSION_HEADER = "compression"
REASON_HEADER = "x-reason"
# aiormq gives any message published without a message_id a random one; when we
# move such a message to a dead-letter queue this header keeps it marked as
# having none, so a replay cannot run it under an invented key.
NO_MESSAGE_ID_HEADER = "x-no-message-id"

Fingerprinter = Callable[[Mapping[str, Any]], bytes]


class Incoming(Protocol):
    """What decoding reads of a delivery: aio-pika's `IncomingMessage` has it, and so
    has the worker's own delivery built from aiormq's frames (`consumers.broker.consume`)."""

    @property
    def body(self) -> bytes: ...
    @property
    def headers(self) -> HeadersType: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def content_encoding(self) -> str | None: ...
    @property
    def message_id(self) -> str | None: ...


class BadInput(StrEnum):
    BODY_TOO_LARGE = "body_too_large"
    INVALID_JSON = "invalid_json"
    BODY_NOT_OBJECT = "body_not_json_object"
    JSON_TOO_DEEP = "json_too_deep"
    MISSING_MESSAGE_ID = "missing_message_id"
    MESSAGE_ID_TOO_LONG = "message_id_too_long"
    MESSAGE_ID_NOT_UTF8 = "message_id_not_utf8"
    MESSAGE_ID_HAS_NUL = "message_id_has_nul"
    BAD_TENANT = "bad_tenant"  # not a string, or longer than 128 bytes
    TENANT_NOT_UTF8 = "tenant_not_utf8"
    TENANT_HAS_NUL = "tenant_has_nul"
    UNSUPPORTED_CONTENT_TYPE = "unsupported_content_type"
    UNSUPPORTED_CONTENT_ENCODING = "unsupported_content_encoding"
    FINGERPRINT_FAILED = "fingerprint_failed"  # the handler's fingerprint function raised


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


def is_text(value: str) -> bool:
    """True when `value` can go on the wire as UTF-8: no lone surrogates, such as
    `consumers.broker.headers.read_leniently` leaves for bytes that are not UTF-8."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


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


def attempt_of(message: Incoming) -> int:
    raw = (message.headers or {}).get(ATTEMPT_HEADER, 1)
    if not isinstance(raw, int) or isinstance(raw, bool):
        return 1
    # From the wire: bounded, or a backoff of 2**attempt or attempt + 1 in a
    # 64-bit header could fail on a value any publisher may send.
    return min(max(raw, 1), MAX_ATTEMPT)


def names_utf8(charset: str) -> bool:
    """`UTF-8` in any case, with or without its hyphen (`utf8`, `UTF_8`), spaces around."""
    return charset.strip().strip('"').lower().replace("-", "").replace("_", "") == "utf8"


def is_json_media_type(content_type: str) -> bool:
    """`application/json`, any case, with parameters, in UTF-8 if a charset is named."""
    media_type, _, parameters = content_type.partition(";")
    if media_type.strip().lower() != JSON_MEDIA_TYPE:
        return False
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and not names_utf8(value):
            return False
    return True


def is_plain_text_encoding(content_encoding: str | None) -> bool:
    """No content encoding, `identity`, or one that names the text's charset as UTF-8."""
    if not content_encoding:
        return True
    return content_encoding.strip().lower() == "identity" or names_utf8(content_encoding)


def deeper_than(value: Any, limit: int) -> bool:
    """True when objects and arrays nest more than `limit` levels in `value`."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if type(item) is dict else item
        stack.extend((c, depth + 1) for c in children if type(c) in (dict, list))
    return False


def _key_problem(value: str, *, not_utf8: BadInput, has_nul: BadInput) -> BadInput | None:
    if not is_text(value):
        return not_utf8
    if "\0" in value:  # PostgreSQL refuses NUL in text
        return has_nul
    return None


def _tenant(headers: Mapping[str, Any]) -> str | BadInput:
    tenant = headers.get(TENANT_HEADER, "")
    if isinstance(tenant, bytes):  # what a long string that is not UTF-8 arrives as
        try:
            tenant = tenant.decode()
        except UnicodeDecodeError:
            return BadInput.TENANT_NOT_UTF8
    if not isinstance(tenant, str):
        return BadInput.BAD_TENANT
    problem = _key_problem(
        tenant, not_utf8=BadInput.TENANT_NOT_UTF8, has_nul=BadInput.TENANT_HAS_NUL
    )
    if problem is not None:
        return problem
    if len(tenant.encode()) > MAX_MESSAGE_ID_BYTES:
        return BadInput.BAD_TENANT
    return tenant


def decode(
    message: Incoming,
    *,
    consumer: str,
    max_body_bytes: int,
    fingerprinter: Fingerprinter | None = None,
) -> Envelope | BadInput:
    """The envelope of `message`, or the reason it cannot be processed."""
    raw = message.body
    if len(raw) > max_body_bytes:
        return BadInput.BODY_TOO_LARGE
    if message.content_type and not is_json_media_type(message.content_type):
        return BadInput.UNSUPPORTED_CONTENT_TYPE
    headers = message.headers or {}
    if not is_plain_text_encoding(message.content_encoding) or headers.get(
        KOMBU_COMPRESSION_HEADER
    ):
        return BadInput.UNSUPPORTED_CONTENT_ENCODING
    message_id = message.message_id
    if not message_id or headers.get(NO_MESSAGE_ID_HEADER):
        return BadInput.MISSING_MESSAGE_ID
    problem = _key_problem(
        message_id, not_utf8=BadInput.MESSAGE_ID_NOT_UTF8, has_nul=BadInput.MESSAGE_ID_HAS_NUL
    )
    if problem is not None:
        return problem
    if len(message_id.encode()) > MAX_MESSAGE_ID_BYTES:
        return BadInput.MESSAGE_ID_TOO_LONG
    tenant = _tenant(headers)
    if isinstance(tenant, BadInput):
        return tenant
    try:
        body, plain = loads_plain(raw)
    except RecursionError:
        return BadInput.JSON_TOO_DEEP
    except (ValueError, UnicodeDecodeError):
        return BadInput.INVALID_JSON
    if not isinstance(body, dict):
        return BadInput.BODY_NOT_OBJECT
    # Counting brackets is cheap and bounds the depth: walk only when it does not.
    if raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH and deeper_than(body, MAX_JSON_DEPTH):
        return BadInput.JSON_TOO_DEEP
    if fingerprinter is None:
        try:
            digest = fingerprint(body, plain=plain)
        except ValueError:  # NaN or Infinity: not JSON we can compare
            return BadInput.INVALID_JSON
    else:
        try:
            digest = fingerprinter(body)
        except Exception:  # the app's own function: its failure is this message's
            return BadInput.FINGERPRINT_FAILED
    return Envelope(
        key=DedupeKey(consumer=consumer, tenant=tenant, message_id=message_id),
        body=body,
        fingerprint=digest,
        attempt=attempt_of(message),
    )
