"""An effects loop's buffer, one line per tenant, taken from in turn.

The broker hands an effects queue's deliveries over in the order they were
published: a tenant's send of 100 parts lands ahead of another tenant's one
push published a moment later. Taken front to back, the push would wait until
the worker holds room for every part before it (`consumers.pipeline.holding`).
So an effects queue's batch loop buffers deliveries by tenant (the `x-tenant`
header, read as they arrive; the envelope's own check comes with the batch):

1. each tenant's deliveries wait in the order they came; the tenants with any
   waiting form a ring;
2. a take goes round the ring, one delivery per tenant per turn, asking
   `admit(tenant, weight)` of each tenant's first; a tenant whose first is
   refused (too heavy for now) is passed over for this take, its other
   deliveries staying behind it, and the others go on;
3. it ends when the batch is full, or a whole turn of the ring took nothing.
   The tenant after the last one taken from is the first asked next time.

A tenant's own deliveries keep their order; between tenants, a batch
interleaves them. (A local-effect queue keeps one line: its batches are acked
`multiple=True` in delivery order.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

from consumers.message.envelope import TENANT_HEADER
from consumers.pipeline.deliveries import Delivery


def tenant_of(delivery: Delivery) -> str:
    """The tenant a delivery is buffered under: its `x-tenant` header, as text."""
    tenant = (delivery.headers or {}).get(TENANT_HEADER, "")
    if isinstance(tenant, str):
        return tenant
    if isinstance(tenant, bytes):  # what a long string arrives as; refused later if not UTF-8
        return tenant.decode(errors="replace")
    return repr(tenant)  # refused at decode; buffered apart from every real tenant


class TenantBuffer:
    """Deliveries with their weights, by tenant (1.), taken in turn (2., 3.)."""

    def __init__(self) -> None:
        self._lines: dict[str, deque[tuple[Delivery, int]]] = {}
        self._ring: deque[str] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[tuple[Delivery, int]]:
        for line in self._lines.values():
            yield from line

    def append(self, entry: tuple[Delivery, int]) -> None:
        tenant = tenant_of(entry[0])
        line = self._lines.get(tenant)
        if line is None:
            line = self._lines[tenant] = deque()
            self._ring.append(tenant)
        line.append(entry)
        self._size += 1

    def tenants(self) -> Iterator[str]:
        """The tenants with deliveries waiting."""
        return iter(self._ring)

    def take(self, most: int, admit: Callable[[Delivery, int, str], bool]) -> list[Delivery]:
        """Up to `most` deliveries, one per tenant per turn, each admitted by
        `admit(delivery, weight, tenant)` (which counts it taken when it says yes)."""
        taken: list[Delivery] = []
        refused: set[str] = set()
        while len(taken) < most and len(refused) < len(self._ring):
            tenant = self._ring[0]
            self._ring.rotate(-1)  # the next tenant's turn, whatever happens to this one
            if tenant in refused:
                continue
            line = self._lines[tenant]
            delivery, weight = line[0]
            if not admit(delivery, weight, tenant):
                refused.add(tenant)
                continue
            line.popleft()
            self._size -= 1
            taken.append(delivery)
            if not line:
                del self._lines[tenant]
                self._ring.pop()  # rotated to the back just now
        return taken
