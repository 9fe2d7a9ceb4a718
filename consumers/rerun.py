"""What both runners do around their transactions: re-run after a lost
database connection, and roll back without raising."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import structlog

from consumers.items import Item
from consumers.verdict import CONNECTION_ERRORS, describe, retry

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Re-runs of one step after connection loss before its messages go to the
# delay tiers instead (a message that breaks the connection must not loop).
MAX_RERUNS = 10


async def rerun_after_disconnect(
    step: Callable[[], Awaitable[T]],
    items: Sequence[Item],
    *,
    consumer: str,
    event: str,
    stalled: Callable[[], None],
) -> T | None:
    """`step()`, run again with backoff while the database connection is lost.

    The step rolled back, or its commit's outcome is unknown: either way
    nothing was acked, and a re-run's claims tell what committed. After the
    last re-run the items get a `database_unavailable` retry and this returns None.
    `stalled()` is called once per hold (the database-stall counter).
    """
    for rerun in range(1, MAX_RERUNS + 1):
        try:
            return await step()
        except CONNECTION_ERRORS as exc:
            for item in items:
                item.verdict = None
            if rerun == MAX_RERUNS:
                for item in items:
                    item.verdict = retry("database_unavailable", error=describe(exc))
                return None
            stalled()
            delay = random.uniform(0, min(5.0, 0.1 * 2**rerun))
            log.warning(
                event,
                consumer=consumer,
                size=len(items),
                error=describe(exc),
                delay=round(delay, 3),
            )
            await asyncio.sleep(delay)
    return None


async def rollback_quietly(tx: Any) -> None:
    """Roll back `tx`; the connection may be gone, and the server rolls back on its own then."""
    with contextlib.suppress(Exception):
        await tx.rollback()
