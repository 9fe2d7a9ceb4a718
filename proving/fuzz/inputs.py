"""What the fuzzer publishes: raw AMQP properties, headers and bodies, as hypothesis strategies.

The space covers what the decoder must decide on, good and bad, in bytes a
publisher can really send: message ids and tenants that are missing, too
long, not UTF-8 or holding NUL; header tables with keys and values that are
not UTF-8, nested, of every field type; content types and encodings in any
case or none; bodies that are JSON objects, other JSON, nested past any
limit, NaN, not UTF-8, or not JSON at all.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import strategies as st

from proving.rawamqp import RawProperties, RawTable, RawValue

T = TypeVar("T")

MAX_SHORT = 255  # bytes in an AMQP short string


@dataclass(frozen=True, slots=True, kw_only=True)
class RawInput:
    properties: RawProperties
    body: bytes


def _short_text() -> st.SearchStrategy[str]:
    return st.text(max_size=40).filter(lambda s: len(s.encode()) <= MAX_SHORT)


def _short_bytes(max_size: int = 40) -> st.SearchStrategy[bytes]:
    return st.binary(max_size=max_size)


def _short() -> st.SearchStrategy[bytes | str]:
    """A short string: text, text with NUL, bytes (mostly not UTF-8), or long."""
    return st.one_of(
        _short_text(),
        _short_text().map(lambda s: s + "\0"),
        _short_bytes(),
        st.integers(min_value=120, max_value=MAX_SHORT).map(lambda n: "k" * n),
    )


def _scalar() -> st.SearchStrategy[RawValue]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),  # the broker refuses NaN (541)
        st.text(max_size=30),
        _short_bytes(30),
        _short_bytes(30).map(bytearray),
    )


def _key() -> st.SearchStrategy[bytes | str]:
    return st.one_of(
        st.text(max_size=20).filter(lambda s: len(s.encode()) <= MAX_SHORT), _short_bytes(20)
    )


def _value() -> st.SearchStrategy[RawValue]:
    return st.recursive(
        _scalar(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(_key(), inner, max_size=3)
        ),
        max_leaves=6,
    )


def _headers() -> st.SearchStrategy[RawTable | None]:
    known = st.fixed_dictionaries(
        {},
        optional={
            "x-tenant": st.one_of(st.sampled_from(["acme", "", "\ufffd"]), _short(), _scalar()),
            "x-attempt": st.one_of(st.integers(min_value=-5, max_value=2**40), _scalar()),
            "x-no-message-id": st.booleans(),
        },
    )
    other = st.dictionaries(_key(), _value(), max_size=4)
    table: st.SearchStrategy[RawTable] = st.builds(lambda a, b: {**b, **a}, known, other)
    return st.one_of(st.none(), table)


_CONTENT_TYPES = (
    "application/json",
    "Application/JSON; charset=utf-8",
    "application/json; charset=latin-1",
    "application/jsonx",
    "text/plain",
)
_ENCODINGS = ("identity", "IDENTITY", "utf-8", "UTF8", "gzip", "deflate", "binary", "")


def _json_value() -> st.SearchStrategy[object]:
    return st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(max_size=20),
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=12,
    )


def _nested(depth: int) -> bytes:
    return b'{"a":' + b"[" * depth + b"]" * depth + b"}"


def _body() -> st.SearchStrategy[bytes]:
    objects = st.dictionaries(st.text(max_size=8), _json_value(), max_size=5)
    return _mostly(
        objects.map(lambda v: json.dumps(v).encode()),
        st.one_of(
            _json_value().map(lambda v: json.dumps(v).encode()),
            objects.map(lambda v: json.dumps(v).encode("utf-16")),
            st.integers(min_value=1, max_value=5_000).map(_nested),
            st.binary(max_size=60),
            st.sampled_from(
                [b'{"n": NaN}', b'{"n": 1e400}', b'{"s": "\xff"}', b'{"s": "\\ud800"}']
            ),
            st.integers(min_value=4_000, max_value=9_000).map(
                lambda n: b'{"p": "' + b"x" * n + b'"}'
            ),
        ),
    )


def _mostly(usual: st.SearchStrategy[T], odd: st.SearchStrategy[T]) -> st.SearchStrategy[T]:
    """`usual` four times in five: most inputs get past one check to meet the next."""
    return st.integers(min_value=0, max_value=4).flatmap(lambda k: odd if k == 0 else usual)


def raw_inputs() -> st.SearchStrategy[RawInput]:
    none = st.none()
    good_id = st.text(
        st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=30
    )
    properties = st.builds(
        RawProperties,
        content_type=_mostly(
            st.sampled_from([None, "application/json"]),
            st.one_of(st.sampled_from(_CONTENT_TYPES), _short()),
        ),
        content_encoding=_mostly(none, st.one_of(st.sampled_from(_ENCODINGS), _short())),
        headers=_headers(),
        delivery_mode=st.sampled_from([1, 2]),
        priority=st.one_of(none, st.integers(min_value=0, max_value=9)),
        correlation_id=_mostly(none, _short()),
        message_id=_mostly(good_id, st.one_of(_short(), none, st.just(""))),
        type=_mostly(none, _short()),
    )
    return st.builds(RawInput, properties=properties, body=_body())
