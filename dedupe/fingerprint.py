"""The default fingerprint: SHA-256 of the canonical JSON of a body.

Canonical means sorted keys and no whitespace, so two bodies that are equal
as JSON values compare equal however the publisher formatted them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    """Serialise `value` as canonical JSON bytes (sorted keys, no spaces)."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def fingerprint(value: Any) -> bytes:
    """The 32-byte SHA-256 of `canonical_json(value)`."""
    return hashlib.sha256(canonical_json(value)).digest()
