"""Decode poison for the chaos run: raw messages that fail outside any handler.

Each is one of the inputs issue 8 found looping a whole batch (JSON nested
too deep, NUL or bytes that are not UTF-8 in a key, a header that cannot be
written back, a content encoding we cannot read), published byte for byte
with `proving.rawamqp`. Each carries `x-chaos-mark` (its name in the run,
since some have no usable message_id) and must end in the dead-letter queue
with its own reason while its batchmates commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from proving.rawamqp import RawProperties

MARK_HEADER = "x-chaos-mark"
_DEEP = 3_000


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodePoison:
    mark: str
    reason: str  # the x-reason its dead letter must carry
    properties: RawProperties
    body: bytes


_Build = Callable[[str], tuple[RawProperties, bytes]]


def _kinds() -> list[tuple[str, _Build]]:
    return [
        (
            "json_too_deep",
            lambda m: (
                RawProperties(message_id=m, headers={MARK_HEADER: m}),
                b'{"a": ' + b"[" * _DEEP + b"]" * _DEEP + b"}",
            ),
        ),
        (
            "message_id_has_nul",
            lambda m: (RawProperties(message_id=f"{m}\0", headers={MARK_HEADER: m}), b"{}"),
        ),
        (
            "tenant_has_nul",
            lambda m: (
                RawProperties(message_id=m, headers={MARK_HEADER: m, "x-tenant": "acme\0"}),
                b"{}",
            ),
        ),
        (
            "message_id_not_utf8",
            lambda m: (
                RawProperties(message_id=m.encode() + b"\xff", headers={MARK_HEADER: m}),
                b"{}",
            ),
        ),
        (
            "tenant_not_utf8",
            lambda m: (
                RawProperties(message_id=m, headers={MARK_HEADER: m, "x-tenant": b"\xfe\xff"}),
                b"{}",
            ),
        ),
        (
            "unsupported_content_encoding",
            lambda m: (
                RawProperties(message_id=m, content_encoding="gzip", headers={MARK_HEADER: m}),
                b"{}",
            ),
        ),
        (
            "invalid_json",  # and a header value pamqp cannot write back
            lambda m: (
                RawProperties(message_id=m, headers={MARK_HEADER: m, "x-trace": b"\xff"}),
                b"{nope",
            ),
        ),
        (
            "invalid_json",  # and a header name that is not UTF-8
            lambda m: (
                RawProperties(message_id=m, headers={MARK_HEADER: m, b"x-\xff": "v"}),
                b"{nope",
            ),
        ),
    ]


def decode_poison(count: int) -> list[DecodePoison]:
    """`count` decode poison messages, the kinds in turn."""
    kinds = _kinds()
    made = []
    for n in range(count):
        reason, build = kinds[n % len(kinds)]
        mark = f"decode-{n}"
        properties, body = build(mark)
        made.append(DecodePoison(mark=mark, reason=reason, properties=properties, body=body))
    return made
