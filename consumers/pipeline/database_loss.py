"""What both runners do around their transactions: re-run after a lost
database connection, and roll back without raising."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from consumers.message.verdict import Verdict, error_text, retry
from dedupe.lost import CONNECTION_ERRORS

log = structlog.get_logger(__name__)

T = TypeVar("T")

# Re-runs of one step after connection loss before its messages go to the
# delay tiers instead (a message that breaks the connection must not loop).
MAX_RERUNS = 10


class DatabaseUnavailable(Exception):
    """The database stayed unreachable through every re-run of a step.

    Not the messages' fault: each of them gets `verdict`, a retry through the
    delay tiers with reason `database_unavailable`.
    """

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.verdict: Verdict = retry("database_unavailable", error=error)


async def rerun_after_disconnect(
    step: Callable[[], Awaitable[T]],
    *,
    consumer: str,
    event: str,
    size: int,
    stalled: Callable[[], None],
) -> T:
    """`step()`, run again with backoff while the database connection is lost.

    The step rolled back, or its commit's outcome is unknown: either way
    nothing was acked, and a re-run's claims tell what committed. After the
    last re-run this raises DatabaseUnavailable. `stalled()` is called once
    per hold (the database-stall counter).
    """
    rerun = 1
    while True:
        try:
            return await step()
        except CONNECTION_ERRORS as exc:
            if rerun == MAX_RERUNS:
                raise DatabaseUnavailable(error_text(exc)) from exc
            stalled()
            delay = random.uniform(0, min(5.0, 0.1 * 2**rerun))
            log.warning(
                event, consumer=consumer, size=size, error=error_text(exc), delay=round(delay, 3)
            )
            await asyncio.sleep(delay)
            rerun += 1


async def rollback_quietly(tx: Any) -> None:
    """Roll back `tx`; the connection may be gone, and the server rolls back on its own then."""
    with contextlib.suppress(Exception):
        await tx.rollback()
