"""The watchdog: a process whose event loop is stuck exits, so it gets restarted.

A handler that blocks the event loop (`time.sleep`, a synchronous HTTP call,
a CPU-bound loop) cannot be cancelled at its deadline: nothing runs until it
returns. Its transaction stays open, its batch unacknowledged, every other
queue of the process stops. The watchdog is a thread: the loop stamps a beat
every BEAT_SECONDS, and once no beat came for `limit` seconds (the longest
handler deadline plus a grace) the thread logs `watchdog_expired` and ends
the process with EXIT_STUCK (`os._exit`: nothing of the stuck loop can run).
The supervisor (`run --processes N`) or the orchestrator starts a new one;
the broker redelivers what the dead one held, and the claims, rolled back
with its connection, let the redelivery run once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import structlog

log = structlog.get_logger(__name__)

EXIT_STUCK = 70  # EX_SOFTWARE: the process could not go on
BEAT_SECONDS = 0.5


class Watchdog:
    """Start with `start()` inside the running loop; `stop()` before the loop ends."""

    def __init__(self, limit: float) -> None:
        if limit <= 0:
            raise ValueError("the watchdog's limit must be positive")
        self.limit = limit
        self._beat = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stamp()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._timer is not None:
            self._timer.cancel()

    def _stamp(self) -> None:
        assert self._loop is not None
        self._beat = time.monotonic()
        self._timer = self._loop.call_later(BEAT_SECONDS, self._stamp)

    def _watch(self) -> None:
        interval = min(1.0, self.limit / 4)
        while not self._stopped.wait(interval):
            silent = time.monotonic() - self._beat
            if silent > self.limit:
                log.critical(
                    "watchdog_expired",
                    silent_s=round(silent, 1),
                    limit_s=self.limit,
                    action="exit",
                    exit_code=EXIT_STUCK,
                    hint="a handler blocks the event loop (a blocking call, not awaited)",
                )
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_STUCK)
