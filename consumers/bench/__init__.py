"""`idempotent-workers bench`: not built yet."""

from __future__ import annotations

from collections.abc import Sequence

from consumers.settings import Settings


def main(argv: Sequence[str], settings: Settings) -> int:
    """Entry point of `idempotent-workers bench`."""
    raise SystemExit("idempotent-workers bench: not built yet")
