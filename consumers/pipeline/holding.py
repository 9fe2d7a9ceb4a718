"""What a queue's batches hold at once, by weight and by tenant: an effects queue's targets.

A push job costs the worker memory by its devices, from the batch that takes
it to its settle: its parsed targets, its ledger rows being written, the sends
of its leased chunk. The channel's prefetch counts deliveries, and one
delivery may be one device or a part of 200; so an effects queue's batch loops
take deliveries by weight (`weigh`: the targets a job names), and by tenant:

1. a delivery is taken into a batch only while its tenant's weight held, its
   own added, stays within the tenant's limit (`tenant_limit`: a default, and
   overrides per tenant), unless the tenant holds nothing;
2. and while the weights held by every tenant, its own added, stay within
   `limit`; or within `limit + reserve` for a light tenant, one holding less
   than the tenant holding the most (the reserve is kept for them: a tenant
   whose large send fills the limit leaves room for another's small jobs,
   and it is the tenant holding the most that waits); or when nothing at all
   is held: a job larger than the limit goes alone, so every job is
   attempted, whatever its size. Held at once: at most `limit + reserve`, or
   one job alone;
3. its weight is given back once it is settled (`release`, from the runner,
   job by job), and at the latest when its batch ends (the loop);
4. what does not fit waits in the loop's buffer, unacked: never requeued, no
   attempt spent, taken as soon as a release makes room (every loop
   `watching` is woken).

Many small jobs weigh one each, so a limit far above the prefetch never
holds them back. One `Holding` serves every channel and lane of a queue in a
process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from consumers.pipeline.deliveries import Delivery


class Holding:
    """The weight a queue's batches hold: at most `limit` (+ `reserve` for light tenants), or
    one delivery alone; each tenant at most its `tenant_limit`, or one delivery alone."""

    def __init__(
        self,
        *,
        limit: int,
        weigh: Callable[[Delivery], int],
        reserve: int = 0,
        tenant_limit: int | None = None,
        tenant_limits: Mapping[str, int] | None = None,
    ) -> None:
        if limit < 1 or reserve < 0:
            raise ValueError("a holding's limit must be at least 1, its reserve at least 0")
        self.limit = limit
        self.reserve = reserve
        self.weigh = weigh
        self.held = 0
        self._tenant_limit = limit if tenant_limit is None else tenant_limit
        self._tenant_limits = dict(tenant_limits or {})
        self._by_tenant: dict[str, int] = {}
        self._most = 0  # what the tenant holding the most holds
        # by id(): deliveries do not hash
        self._taken: dict[int, tuple[Delivery, int, str]] = {}
        self._watching: set[asyncio.Event] = set()

    def tenant_limit(self, tenant: str) -> int:
        """What `tenant` may hold at once (1.): its override, else the default."""
        return self._tenant_limits.get(tenant, self._tenant_limit)

    def held_by(self, tenant: str) -> int:
        return self._by_tenant.get(tenant, 0)

    def light(self, tenant: str) -> bool:
        """`tenant` holds nothing, or less than the tenant holding the most."""
        mine = self._by_tenant.get(tenant, 0)
        return not mine or mine < self._most

    def admits(self, weight: int, tenant: str = "") -> bool:
        """Steps 1 and 2: whether a delivery of `weight` of `tenant` may be taken now."""
        mine = self._by_tenant.get(tenant, 0)
        if mine and mine + weight > self.tenant_limit(tenant):
            return False
        if self.held == 0 or self.held + weight <= self.limit:
            return True
        light = not mine or mine < self._most
        return light and self.held + weight <= self.limit + self.reserve

    def take(self, delivery: Delivery, weight: int, tenant: str = "") -> None:
        self._taken[id(delivery)] = (delivery, weight, tenant)
        self.held += weight
        mine = self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + weight
        self._most = max(self._most, mine)

    def release(self, deliveries: Iterable[Delivery]) -> None:
        """Step 3: give back the weight of these deliveries; twice counts once."""
        freed = 0
        for delivery in deliveries:
            taken = self._taken.pop(id(delivery), None)
            if taken is None:
                continue
            _, weight, tenant = taken
            freed += weight
            before = self._by_tenant[tenant]
            if before > weight:
                self._by_tenant[tenant] = before - weight
            else:
                del self._by_tenant[tenant]
            if before == self._most:  # it held the most: who does now
                self._most = max(self._by_tenant.values(), default=0)
        if freed:
            self.held -= freed
            for wake in self._watching:
                wake.set()

    def watching(self, wake: asyncio.Event) -> None:
        """Step 4: `wake` is set at every release (a loop's own wake-up event)."""
        self._watching.add(wake)
