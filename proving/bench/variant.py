"""What a benchmarked consumer is: a name, a line of description, a coroutine.

Each variant consumes `Run.messages` messages from the sandbox's work queue
and returns once the stopwatch has seen them all acknowledged (or the run's
time is up), having closed what it opened. The stopwatch, not the variant,
does the timing; the one exception is `bare`, timed from outside by the
queue's depth (`proving.bench.untimed`), which returns its own Timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from consumers import Settings
from proving.bench.sandbox import Sandbox
from proving.bench.stopwatch import Stopwatch, Timing

POOL_SIZE = 10  # the hand-written consumers' asyncpg pool


class RunTimedOut(Exception):
    """A variant did not ack every message in time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    sandbox: Sandbox
    settings: Settings  # the worker's, pointing at the sandbox schema
    messages: int
    prefetch: int
    watch: Stopwatch
    timeout: float
    log_file: str  # where every variant's log lines go

    async def finished(self) -> None:
        """Return when every message is acked; raise RunTimedOut past the timeout."""
        try:
            await asyncio.wait_for(self.watch.done.wait(), timeout=self.timeout)
        except TimeoutError:
            raise RunTimedOut(
                f"{self.watch.acked} of {self.messages} acked in {self.timeout:.0f} s"
            ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    name: str
    what: str
    consume: Callable[[Run], Coroutine[Any, Any, Timing | None]]  # None: the stopwatch's
    writes: bool = True  # one effect row per message, checked after the run
    slow: bool = False  # a slow rival: runs --slow-messages (its rate is what matters)
