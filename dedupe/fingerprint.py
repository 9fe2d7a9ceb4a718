"""The default fingerprint: SHA-256 of the canonical JSON of a body.

Canonical means sorted keys and no whitespace, so two bodies that are equal
as JSON values compare equal however the publisher formatted them.

Fingerprints are stored with every claim, so the bytes must never change:
`canonical_json` is defined by the standard library's `json.dumps` (sorted
keys, `,` and `:` separators, UTF-8, no NaN). orjson writes the same bytes
several times faster for everything but floats (it spells exponents its own
way: `1e16`, not `1e+16`), so values made only of dicts with str keys, lists,
str, int, bool and None take orjson, and anything else the standard library.
A property test holds the two to the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

_PLAIN = (str, int, bool, type(None))


def is_plain(value: Any) -> bool:
    """True when `value` is only dicts with str keys, lists, str, int, bool and None.

    Then orjson's sorted output is byte-identical to `json.dumps`'s, and a
    value orjson decoded holds no int it had to read as a float.
    """
    stack = [value]
    pop, push = stack.pop, stack.append
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return False
                push(child)
        elif kind is list:
            stack.extend(item)
        elif kind not in _PLAIN:
            return False
    return True


def _standard_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def canonical_json(value: Any, *, plain: bool | None = None) -> bytes:
    """Serialise `value` as canonical JSON bytes (sorted keys, no spaces).

    `plain`: what `is_plain(value)` says, when the caller has asked already.
    """
    if plain is None:
        plain = is_plain(value)
    if plain:
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except (TypeError, orjson.JSONEncodeError):
            pass  # an int past 64 bits, a lone surrogate: the standard library decides
    return _standard_json(value)


def fingerprint(value: Any, *, plain: bool | None = None) -> bytes:
    """The 32-byte SHA-256 of `canonical_json(value)`."""
    return hashlib.sha256(canonical_json(value, plain=plain)).digest()
