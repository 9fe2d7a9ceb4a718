"""Liveness and readiness of a worker process: what /healthz and /readyz answer.

- live: the event loop answers. A beat stamps the time every BEAT_SECONDS;
  the process is live while its last beat is younger than LIVE_WITHIN_SECONDS.
  Liveness never asks RabbitMQ or PostgreSQL: an outage of either must not
  get every pod restarted.
- ready: connected to RabbitMQ, consuming, PostgreSQL answering a `SELECT 1`
  within CHECK_TIMEOUT_SECONDS, no provider circuit open (the worker's
  `readiness()` decides). Checked every CHECK_SECONDS inside the loop; an
  answer older than LIVE_WITHIN_SECONDS counts as not ready.

The HTTP thread only reads what the loop last wrote, so a probe never waits
on the loop or on a service. The same two answers go to the gauges
`idempotent_workers_heartbeat_timestamp_seconds` and `idempotent_workers_ready`,
which is how a supervisor learns them from its children.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from consumers.message.verdict import error_text
from consumers.telemetry.metrics import Metrics

BEAT_SECONDS = 1.0
CHECK_SECONDS = 2.0
CHECK_TIMEOUT_SECONDS = 2.0
LIVE_WITHIN_SECONDS = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    ok: bool
    detail: str


class HealthView(Protocol):
    """What the endpoint asks, from its own thread."""

    def liveness(self) -> Status: ...

    def readiness(self) -> Status: ...


NOT_CHECKED = Status(ok=False, detail="not checked yet")


class Heartbeat:
    """Runs in the worker's loop; keeps the last beat and the last readiness answer."""

    def __init__(self, check: Callable[[], Awaitable[Status]], metrics: Metrics) -> None:
        self._check = check
        self._metrics = metrics
        self._beat = time.time()
        self._ready = NOT_CHECKED
        self._checked_at = 0.0

    async def run(self) -> None:
        """Beat and check until cancelled."""
        checking = asyncio.create_task(self._check_forever())
        try:
            while True:
                self._beat = time.time()
                self._metrics.heartbeat.set(self._beat)
                await asyncio.sleep(BEAT_SECONDS)
        finally:
            checking.cancel()
            await asyncio.gather(checking, return_exceptions=True)

    async def _check_forever(self) -> None:
        while True:
            try:
                async with asyncio.timeout(CHECK_TIMEOUT_SECONDS + 1):
                    status = await self._check()
            except Exception as exc:  # a check that fails is an answer: not ready
                status = Status(ok=False, detail=f"readiness check failed: {error_text(exc)}")
            self._ready = status
            self._checked_at = time.time()
            self._metrics.ready.set(1 if status.ok else 0)
            await asyncio.sleep(CHECK_SECONDS)

    def liveness(self) -> Status:
        age = time.time() - self._beat
        return Status(ok=age < LIVE_WITHIN_SECONDS, detail=f"event loop answered {age:.1f} s ago")

    def readiness(self) -> Status:
        age = time.time() - self._checked_at
        if self._checked_at and age >= LIVE_WITHIN_SECONDS:
            return Status(ok=False, detail=f"readiness last checked {age:.0f} s ago")
        return self._ready
