"""Peak resident memory of the bench process while a run lasts (Linux /proc)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

SAMPLE_SECONDS = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident set size now; 0 where /proc is missing."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


class Peak:
    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = resident_bytes()

    @property
    def megabytes(self) -> float:
        return self.bytes / 1_048_576


@asynccontextmanager
async def peak_resident() -> AsyncIterator[Peak]:
    """Sample the resident set every 50 ms while the block runs; keep the peak."""
    peak = Peak()

    async def sample() -> None:
        while True:
            peak.bytes = max(peak.bytes, resident_bytes())
            await asyncio.sleep(SAMPLE_SECONDS)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # unbounded: our sampler, cancelled: it ends at its next sleep
        peak.bytes = max(peak.bytes, resident_bytes())
