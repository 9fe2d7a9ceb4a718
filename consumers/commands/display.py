"""One dead letter written out for a terminal, as `dlq show` prints it: whole, readable, safe.

    properties:            every property the message has, times in ISO 8601 UTC
    headers:               sorted, nested tables indented; `x-dead-lettered-at`
                           (epoch milliseconds) and AMQP timestamps in ISO 8601 UTC
    body (N bytes):        indented two spaces, so no line of it can pass for one of ours:
                           JSON pretty-printed with real newlines, any character a
                           terminal would act on written as a JSON `\\u` escape
                           (so it still reads back to the same value); anything else
                           (not JSON, nested past the reader's reach, not UTF-8) as
                           received, through `printable` with its newlines and tabs kept

Everything else that came from the message goes through `printable()`.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from consumers.commands.deadletters import DeadLetter
from consumers.commands.printable import is_safe, printable
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER

PROPERTIES = (
    "message_id",
    "content_type",
    "content_encoding",
    "correlation_id",
    "type",
    "timestamp",
    "delivery_mode",
    "priority",
    "app_id",
    "user_id",
    "reply_to",
    "expiration",
    "redelivered",
)
# Headers whose integer is a time in epoch milliseconds (the framework's own).
EPOCH_MS_HEADERS = frozenset({DEAD_LETTERED_AT_HEADER})
BODY_INDENT = "  "


def iso_utc(moment: datetime.datetime) -> str:
    """`2026-12-01T04:10:31.125Z`: a naive time (AMQP's timestamps) is taken as UTC."""
    aware = moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)
    return aware.astimezone(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def from_epoch_ms(value: object) -> str | None:
    """An epoch-milliseconds integer as ISO 8601 UTC; None if it is not one."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    try:
        return iso_utc(datetime.datetime.fromtimestamp(value / 1000, datetime.UTC))
    except (OverflowError, OSError, ValueError):  # past year 9999, or before year 1
        return None


def shown(letter: DeadLetter) -> list[str]:
    """The lines `dlq show` prints for one copy: properties, headers, body."""
    message = letter.message
    lines = ["properties:"]
    for name in PROPERTIES:
        value = getattr(message, name, None)
        if value is not None:
            lines.append(f"  {name}: {_scalar(value)}")
    lines.append("headers:")
    lines.extend(_tree(message.headers or {}, "  "))
    lines.append(f"body ({len(message.body)} bytes):")
    lines.extend(BODY_INDENT + line for line in readable_body(message.body).split("\n"))
    return lines


def readable_body(body: bytes) -> str:
    """`body` pretty-printed if it is JSON, else as received; safe for a terminal either way."""
    try:
        text = json.dumps(json.loads(body), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):  # RecursionError: `json_too_deep`, say
        return printable(body, keep_lines=True)
    if text.replace("\n", "").isprintable():  # the common case, without a walk
        return text
    return "".join(char if char == "\n" or is_safe(char) else _json_escape(char) for char in text)


def _json_escape(char: str) -> str:
    """`char` as JSON writes it escaped: `\\u202e`, or a surrogate pair past U+FFFF."""
    return json.dumps(char)[1:-1] if ord(char) > 0xFFFF else f"\\u{ord(char):04x}"


def _tree(headers: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for name in sorted(headers):
        value = headers[name]
        if isinstance(value, Mapping):
            lines.append(f"{indent}{printable(name)}:")
            lines.extend(_tree(value, indent + "  "))
        elif isinstance(value, list):
            lines.append(f"{indent}{printable(name)}:")
            for item in value:
                if isinstance(item, Mapping):
                    lines.append(f"{indent}  -")
                    lines.extend(_tree(item, indent + "    "))
                else:
                    lines.append(f"{indent}  - {_scalar(item)}")
        elif name in EPOCH_MS_HEADERS and (moment := from_epoch_ms(value)) is not None:
            lines.append(f"{indent}{printable(name)}: {moment}")
        else:
            lines.append(f"{indent}{printable(name)}: {_scalar(value)}")
    return lines


def _scalar(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return f"(bytes, not UTF-8) {printable(value)}"
    if isinstance(value, datetime.datetime):
        return iso_utc(value)
    return printable(str(value))
