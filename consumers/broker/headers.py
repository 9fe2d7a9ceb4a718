"""What a publisher may put on the wire that pamqp (under aio-pika) cannot carry.

The broker passes properties and headers on unchecked, so any client can
send bytes our AMQP library chokes on. Each trap, and what we do instead:

(a) a short-string property (`message_id`, `content_type`, ...) or a header
    table key that is not UTF-8: pamqp raises while reading the content
    header, aiormq drops the whole connection, every unacked message of every
    channel is redelivered, and the same message breaks the next connection
    too. `read_leniently()` (the worker calls it once at start) makes pamqp
    read such a string with `surrogateescape`: the bytes survive as lone
    surrogates, and `consumers.message.envelope.decode` rejects a key holding them.
(b) a long-string header value that is not UTF-8 arrives as `bytes`, which
    pamqp cannot write back: republishing the message to a retry tier or a
    dead-letter queue fails. `republishable_headers()` keeps such a value as
    a byte array (`bytearray`, written back byte for byte) and a key that
    cannot be written is dropped and named in `x-dropped-headers`.
(c) a double header value arrives as a float, which pamqp writes back as a
    single-precision float: one past its range fails the republish. Such a
    value is kept as its decimal text.
(d) a short-string property that cannot be written back is left out of the
    republished message and kept, raw, in an `x-raw-<name>` header.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any

import aio_pika
from pamqp import common, decode

from consumers.broker.consume import Delivery
from consumers.message.envelope import NO_MESSAGE_ID_HEADER, is_text

DROPPED_HEADERS = "x-dropped-headers"
RAW_PREFIX = "x-raw-"
FLOAT32_MAX = 3.4028234663852886e38


def raw_bytes(value: str) -> bytes:
    """The bytes a string read by `read_leniently` came from."""
    return value.encode("utf-8", "surrogateescape")


def _short_str(value: bytes) -> tuple[int, str]:
    try:
        length = common.Struct.byte.unpack(value[0:1])[0]
    except struct.error as err:
        raise ValueError("Could not unpack short string value") from err
    return length + 1, value[1 : length + 1].decode("utf-8", "surrogateescape")


def _field_table(value: bytes) -> tuple[int, common.FieldTable]:
    """pamqp's `decode.field_table`, reading keys with `surrogateescape`."""
    try:
        length = common.Struct.integer.unpack(value[0:4])[0]
        offset = 4
        data: dict[str, Any] = {}
        end = offset + length
        if end > len(value):
            raise ValueError("Field table length exceeds available data")
        while offset < end:
            key_length = common.Struct.byte.unpack_from(value, offset)[0]
            offset += 1
            if offset + key_length > end:
                raise ValueError("Field table key length exceeds data")
            key = value[offset : offset + key_length].decode("utf-8", "surrogateescape")
            offset += key_length
            consumed, result = decode.embedded_value(value[offset:])
            offset += consumed
            data[key] = result
        return end, data
    except (struct.error, TypeError) as err:
        raise ValueError("Could not unpack data") from err


def read_leniently() -> None:
    """Make pamqp read non-UTF-8 short strings and table keys instead of failing the frame.

    Process-wide (pamqp has one decoder table) and idempotent; only what
    pamqp would refuse reads differently.
    """
    decode.METHODS["shortstr"] = _short_str
    decode.METHODS["table"] = _field_table
    decode.TABLE_MAPPING[b"F"] = _field_table


def _writable(value: Any) -> Any:
    """`value` as pamqp can write it: bytes and non-UTF-8 strings as byte arrays."""
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, str) and not is_text(value):
        return bytearray(raw_bytes(value))
    if isinstance(value, float) and math.isfinite(value) and abs(value) > FLOAT32_MAX:
        return repr(value)
    if isinstance(value, Mapping):
        return republishable_headers(value)
    if isinstance(value, list):
        return [_writable(v) for v in value]
    return value


def republishable_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """`headers` as pamqp can write them: raw bytes kept as byte arrays, bad keys dropped."""
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in headers.items():
        if is_text(key):
            kept[key] = _writable(value)
        else:
            dropped.append(ascii(raw_bytes(key)))
    if dropped:
        kept[DROPPED_HEADERS] = ", ".join(dropped)[:4000]
    return kept


def property_or_raw(name: str, value: str | None, headers: dict[str, Any]) -> str | None:
    """`value` if pamqp can write it as property `name`; else None, its bytes kept in a header."""
    if value is None or is_text(value):
        return value
    headers[f"{RAW_PREFIX}{name}"] = bytearray(raw_bytes(value))
    return None


def republished(delivery: Delivery, headers: dict[str, Any]) -> aio_pika.Message:
    """`delivery` as a new persistent message with `headers` (from `republishable_headers`).

    A property that cannot be written back is left out and kept in `x-raw-<name>`;
    without its message_id the message is marked as having none.
    """
    message_id = property_or_raw("message_id", delivery.message_id, headers)
    if message_id is None:
        headers[NO_MESSAGE_ID_HEADER] = True
    return aio_pika.Message(
        delivery.body,
        headers=headers,
        content_type=property_or_raw("content_type", delivery.content_type, headers),
        content_encoding=property_or_raw("content_encoding", delivery.content_encoding, headers),
        message_id=message_id,
        correlation_id=property_or_raw("correlation_id", delivery.correlation_id, headers),
        type=property_or_raw("type", delivery.type, headers),
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
