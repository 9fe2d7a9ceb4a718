"""How many sends each provider gets at once: its `max_in_flight`, the rest wait in the worker.

A send queued inside a provider (FCM's thread pool, APNs waiting for a stream)
would carry the deadline it was handed when queued, stale by the time it can
start; queued here, it reads the lease when a slot frees, and a lease renewed
meanwhile counts. The limit is read at each release (APNs learns its stream
limit from the server's SETTINGS), and a release wakes only the waiters it has
room for, first in first out: one Condition woken for every waiter on every
release made a 2,000-device send take twice as long.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from providers import Sender


class ProviderGate:
    """At most `max_in_flight` sends in each provider; the others wait here, first in first out.

    The limit is read at each release (APNs learns its streams from the server), and
    a release wakes only the waiters it has room for."""

    def __init__(self) -> None:
        self._busy: dict[int, int] = {}
        self._waiting: dict[int, deque[asyncio.Future[None]]] = {}

    def slot(self, provider: Sender[Any]) -> _Slot:
        """`async with gate.slot(provider):` one send's time in the provider."""
        return _Slot(self, provider)

    async def _enter(self, provider: Sender[Any]) -> None:
        key = id(provider)
        waiting = self._waiting.setdefault(key, deque())
        if waiting or self._busy.get(key, 0) >= max(1, provider.max_in_flight):
            turn = asyncio.get_running_loop().create_future()
            waiting.append(turn)
            try:
                await turn  # the release that wakes it counts it busy
            except asyncio.CancelledError:
                if turn.done():  # woken and cancelled at once: hand the slot on
                    self._release(provider)
                else:
                    waiting.remove(turn)
                raise
        else:
            self._busy[key] = self._busy.get(key, 0) + 1

    def _release(self, provider: Sender[Any]) -> None:
        key = id(provider)
        self._busy[key] -= 1
        waiting = self._waiting[key]
        while waiting and self._busy[key] < max(1, provider.max_in_flight):
            turn = waiting.popleft()
            if not turn.done():
                self._busy[key] += 1
                turn.set_result(None)


class _Slot:
    """One send's slot: a class, not `contextlib.asynccontextmanager`, whose
    generator and wrapper were a cost every send paid (1.4% of a one-device
    worker's CPU in a profile)."""

    __slots__ = ("_gate", "_provider")

    def __init__(self, gate: ProviderGate, provider: Sender[Any]) -> None:
        self._gate = gate
        self._provider = provider

    async def __aenter__(self) -> None:
        await self._gate._enter(self._provider)

    async def __aexit__(self, *exc_info: object) -> None:
        self._gate._release(self._provider)
