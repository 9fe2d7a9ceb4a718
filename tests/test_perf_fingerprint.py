"""The fast canonical JSON (orjson) writes exactly the standard library's bytes.

Fingerprints are stored with every claim: if an upgrade changed one byte of
the canonical JSON, redeliveries of committed messages would read as reused
message ids. So the contract is `json.dumps`'s output, whatever takes the
fast path; and orjson's decoding must give `json.loads`'s values.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.message.envelope import loads_json
from dedupe import canonical_json

scalars = (
    st.none()
    | st.booleans()
    | st.integers()  # past 64 bits too
    | st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


def reference(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def outcome(fn: Any, value: Any) -> Any:
    try:
        return fn(value)
    except Exception as exc:  # the same error class is part of the contract
        return type(exc)


@settings(max_examples=500, deadline=None)
@given(values)
def test_canonical_json_is_the_standard_librarys_bytes(value: Any) -> None:
    assert outcome(canonical_json, value) == outcome(reference, value)


@settings(max_examples=500, deadline=None)
@given(values)
def test_decoding_gives_the_standard_librarys_values(value: Any) -> None:
    raw = json.dumps(value, ensure_ascii=False).encode()
    # repr, not ==: 2**64 read as a float compares equal to the int.
    assert repr(loads_json(raw)) == repr(json.loads(raw))


def test_decoding_accepts_what_the_standard_library_accepts() -> None:
    for raw in [
        b'{"n": 123456789012345678901234567890}',
        b'{"n": -9223372036854775809}',
        b"[1,\n  18446744073709551616]",
        b'{"s": "\\ud800"}',
        b"[NaN, 1e400]",
    ]:
        assert repr(loads_json(raw)) == repr(json.loads(raw))
