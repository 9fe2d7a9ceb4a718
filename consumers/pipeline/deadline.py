"""Handler deadlines: past its deadline a handler is cancelled and its message retried.

    with Deadline(seconds) as deadline:
        for ctx in contexts:
            deadline.lap(time.perf_counter())   # this handler's clock starts now
            await handle(ctx)

One timer serves a whole run of handlers: `lap()` only notes when the current
handler started, and the timer, when it fires before that handler is due,
sets itself again for the handler's own deadline. So the fast path pays one
timer per batch, not one per message. Expiry cancels the task; the handler's
awaits end with CancelledError, its savepoint or transaction is rolled back,
and `__exit__` turns the cancellation into HandlerTimeout. A cancellation
from anyone else (shutdown) stays a cancellation.

A handler that never awaits (a blocking call) cannot be cancelled: the
watchdog (`consumers.runtime.watchdog`) ends the process instead.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consumers.handlers.spec import HandlerSpec


class HandlerTimeout(Exception):
    """A handler ran past its deadline and was cancelled."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"handler ran past its {seconds:g} s deadline")
        self.seconds = seconds


class Deadline:
    """Cancels the current task once the handler running now is `seconds` old."""

    __slots__ = ("_cancelling", "_loop", "_task", "_timer", "expired", "seconds", "since")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.since = 0.0
        self.expired = False
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancelling = 0

    def lap(self, now: float) -> None:
        """The next handler starts at `now` (a `time.perf_counter()` reading)."""
        self.since = now

    def __enter__(self) -> Deadline:
        task = asyncio.current_task()
        assert task is not None, "a Deadline runs inside a task"
        self._task = task
        self._cancelling = task.cancelling()
        self._loop = asyncio.get_running_loop()
        self.since = time.perf_counter()
        self._timer = self._loop.call_later(self.seconds, self._check)
        return self

    def _check(self) -> None:
        assert self._task is not None and self._loop is not None
        left = self.since + self.seconds - time.perf_counter()
        if left > 0:  # the handler running now started after the timer was set
            self._timer = self._loop.call_later(left, self._check)
            return
        self._timer = None
        self.expired = True
        self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.expired:
            return
        assert self._task is not None
        # Only our own cancellation becomes a timeout: a stop asked for
        # meanwhile (shutdown) stays a cancellation. A handler that turned the
        # cancellation into an error of its own timed out all the same.
        ours = self._task.uncancel() <= self._cancelling
        if ours and isinstance(exc, asyncio.CancelledError | Exception):
            raise HandlerTimeout(self.seconds) from exc


def longest_deadline(specs: Iterable[HandlerSpec], default: float) -> float:
    """The longest handler deadline of an app: what the watchdog and the sessions allow."""
    return max([default, *(s.timeout for s in specs if s.timeout is not None)])
