"""What a queue's batches hold at once, by weight: a push queue's devices.

A push job costs the worker memory by its devices, from the batch that takes
it to its settle: its parsed targets, its ledger rows being written, the sends
of its leased chunk. The channel's prefetch counts deliveries, and one
delivery may be one device or a part of 200; so a push queue's batch loops
take deliveries by weight (`weigh`: the devices a job names):

1. a delivery is taken into a batch only while the weights held, its own
   added, stay within `limit`, or when nothing at all is held: a job larger
   than the limit goes alone, so every job is attempted, whatever its size;
2. its weight is given back once it is settled (`release`, from the runner,
   job by job), and at the latest when its batch ends (the loop);
3. what does not fit waits in the loop's buffer, unacked: never requeued, no
   attempt spent, taken as soon as a release makes room (`room()`).

Many small jobs weigh one each, so a limit far above the prefetch never
holds them back. One `Holding` serves every channel of a queue in a process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from consumers.pipeline.deliveries import Delivery


class Holding:
    """The weight a queue's batches hold: at most `limit`, or one delivery alone."""

    def __init__(self, *, limit: int, weigh: Callable[[Delivery], int]) -> None:
        if limit < 1:
            raise ValueError("a holding's limit must be at least 1")
        self.limit = limit
        self.weigh = weigh
        self.held = 0
        self._taken: dict[int, tuple[Delivery, int]] = {}  # by id(): deliveries do not hash
        self._released = asyncio.Event()

    def admits(self, weight: int) -> bool:
        """Step 1: whether a delivery of `weight` may be taken now."""
        return self.held == 0 or self.held + weight <= self.limit

    def take(self, delivery: Delivery, weight: int) -> None:
        self._taken[id(delivery)] = (delivery, weight)
        self.held += weight

    def release(self, deliveries: Iterable[Delivery]) -> None:
        """Step 2: give back the weight of these deliveries; twice counts once."""
        freed = 0
        for delivery in deliveries:
            taken = self._taken.pop(id(delivery), None)
            if taken is not None:
                freed += taken[1]
        if freed:
            self.held -= freed
            self._released.set()

    def watch(self) -> None:
        """Before a look at the buffer: `room()` then waits for a release after this."""
        self._released.clear()

    async def room(self) -> None:
        """Step 3: until a release since `watch()` (something is held: one will come)."""
        await self._released.wait()
