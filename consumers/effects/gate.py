"""How many sends each provider gets at once: its `max_in_flight`, the rest wait in the worker,
in line by tenant, the slots handed to the tenants in turn.

A send queued inside a provider (FCM's connection pool, APNs waiting for a
stream) would carry the deadline it was handed when queued, stale by the time
it can start; queued here, it reads the lease when a slot frees, and a lease
renewed meanwhile counts. The limit is read at each release (APNs learns its
stream limit from the server's SETTINGS), and a release wakes only the waiters
it has room for: one Condition woken for every waiter on every release made a
2,000-device send take twice as long.

1. each provider has one line per tenant with sends waiting, first in first
   out within it, and a ring of those tenants;
2. a release hands its slot to the first send of the tenant at the ring's
   front, which then goes to the ring's back if it has more waiting: the
   slots go round the tenants, one each per turn, whatever each has queued;
3. a tenant that had nothing waiting joins the ring's back: its first send
   waits for at most one slot per tenant ahead of it in the ring, however many
   sends those tenants have queued (a 20,000-device send queues thousands).

One gate serves every batch of a queue in a process (its lanes and channels
together): the provider's limit is one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from providers import Sender


class _Line:
    """One provider's waiting sends, by tenant (1.)."""

    __slots__ = ("busy", "ring", "waiting")

    def __init__(self) -> None:
        self.busy = 0
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self.ring: deque[str] = deque()  # the tenants with sends waiting, in turn order

    def __len__(self) -> int:
        return len(self.ring)

    def join(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queued = self.waiting.get(tenant)
        if queued is None:
            queued = self.waiting[tenant] = deque()
            self.ring.append(tenant)  # 3.
        queued.append(turn)

    def leave(self, tenant: str, turn: asyncio.Future[None]) -> None:
        queued = self.waiting[tenant]
        queued.remove(turn)
        if not queued:
            del self.waiting[tenant]
            self.ring.remove(tenant)

    def next_turn(self) -> asyncio.Future[None]:
        """The first send of the tenant whose turn it is (2.); the ring is not empty."""
        tenant = self.ring.popleft()
        queued = self.waiting[tenant]
        turn = queued.popleft()
        if queued:
            self.ring.append(tenant)
        else:
            del self.waiting[tenant]
        return turn


class ProviderGate:
    """At most `max_in_flight` sends in each provider; the others wait here, the tenants
    served in turn, each tenant's sends in order.

    The limit is read at each release (APNs learns its streams from the server), and
    a release wakes only the waiters it has room for."""

    def __init__(self) -> None:
        self._lines: dict[int, _Line] = {}

    def slot(self, provider: Sender[Any], tenant: str = "") -> _Slot:
        """`async with gate.slot(provider, tenant):` one send's time in the provider."""
        return _Slot(self, provider, tenant)

    def waiting(self, provider: Sender[Any]) -> int:
        """Tenants with sends waiting for `provider`."""
        line = self._lines.get(id(provider))
        return 0 if line is None else len(line)

    async def _enter(self, provider: Sender[Any], tenant: str) -> None:
        line = self._lines.get(id(provider))
        if line is None:
            line = self._lines[id(provider)] = _Line()
        if line.ring or line.busy >= max(1, provider.max_in_flight):
            turn = asyncio.get_running_loop().create_future()
            line.join(tenant, turn)
            try:
                await turn  # the release that wakes it counts it busy
            except asyncio.CancelledError:
                # The task's cancel cancels the turn unless a release woke it first.
                if turn.cancelled():
                    line.leave(tenant, turn)
                else:  # woken and cancelled at once: hand the slot on
                    self._release(provider)
                raise
        else:
            line.busy += 1

    def _release(self, provider: Sender[Any]) -> None:
        line = self._lines[id(provider)]
        line.busy -= 1
        while line.ring and line.busy < max(1, provider.max_in_flight):
            turn = line.next_turn()
            if not turn.done():
                line.busy += 1
                turn.set_result(None)


class _Slot:
    """One send's slot: a class, not `contextlib.asynccontextmanager`, whose
    generator and wrapper were a cost every send paid (1.4% of a one-device
    worker's CPU in a profile)."""

    __slots__ = ("_gate", "_provider", "_tenant")

    def __init__(self, gate: ProviderGate, provider: Sender[Any], tenant: str) -> None:
        self._gate = gate
        self._provider = provider
        self._tenant = tenant

    async def __aenter__(self) -> None:
        await self._gate._enter(self._provider, self._tenant)

    async def __aexit__(self, *exc_info: object) -> None:
        self._gate._release(self._provider)
