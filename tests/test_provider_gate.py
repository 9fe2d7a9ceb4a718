"""The provider gate: at most `max_in_flight` sends inside, the rest in line, a cancel in line
hands nothing on twice."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from consumers.effects.gate import ProviderGate
from providers import Provider


class Limited:
    """A stand-in with the one attribute the gate reads."""

    def __init__(self, max_in_flight: int) -> None:
        self.max_in_flight = max_in_flight


def as_provider(limited: Limited) -> Provider:
    return cast(Provider, cast(Any, limited))


async def test_sends_past_the_limit_wait_in_line_and_go_in_order() -> None:
    gate, provider = ProviderGate(), as_provider(Limited(2))
    entered: list[int] = []
    leave = asyncio.Event()

    async def send(n: int) -> None:
        async with gate.slot(provider):
            entered.append(n)
            await leave.wait()

    tasks = [asyncio.create_task(send(n)) for n in range(5)]
    async with asyncio.timeout(5):
        while len(entered) < 2:
            await asyncio.sleep(0)
    for _ in range(10):  # the others stay in line while the two are inside
        await asyncio.sleep(0)
    assert entered == [0, 1]
    leave.set()
    async with asyncio.timeout(5):
        await asyncio.gather(*tasks)
    assert entered == [0, 1, 2, 3, 4]


async def test_a_send_cancelled_in_line_leaves_its_place_and_takes_no_slot() -> None:
    gate, provider = ProviderGate(), as_provider(Limited(1))
    inside = asyncio.Event()
    leave = asyncio.Event()
    entered: list[str] = []

    async def holder() -> None:
        async with gate.slot(provider):
            inside.set()
            await leave.wait()

    async def send(name: str) -> None:
        async with gate.slot(provider):
            entered.append(name)

    first = asyncio.create_task(holder())
    async with asyncio.timeout(5):
        await inside.wait()
    cancelled = asyncio.create_task(send("cancelled"))
    later = asyncio.create_task(send("later"))
    await asyncio.sleep(0)
    cancelled.cancel()
    leave.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, later)
    assert cancelled.cancelled()
    assert entered == ["later"]
    # Every slot is back: as many sends as the limit allows go in at once again.
    async with asyncio.timeout(5):
        async with gate.slot(provider):
            pass


async def test_a_cancel_in_line_never_lets_more_than_the_limit_in() -> None:
    gate, provider = ProviderGate(), as_provider(Limited(1))
    inside = 0
    most = 0
    holder_in = asyncio.Event()
    leave = asyncio.Event()

    async def send(wait: asyncio.Event | None = None) -> None:
        nonlocal inside, most
        async with gate.slot(provider):
            inside += 1
            most = max(most, inside)
            if wait is not None:
                holder_in.set()
                await wait.wait()
            await asyncio.sleep(0)
            inside -= 1

    holder = asyncio.create_task(send(leave))
    async with asyncio.timeout(5):
        await holder_in.wait()
    cancelled = asyncio.create_task(send())
    later = [asyncio.create_task(send()) for _ in range(3)]
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    leave.set()
    async with asyncio.timeout(5):
        await asyncio.gather(holder, *later)
    assert most == 1


async def test_the_slots_go_round_the_tenants_so_a_newcomer_waits_one_turn() -> None:
    """Tenant A queues 200 sends; B's one send, queued after them, is the second to enter."""
    gate, provider = ProviderGate(), as_provider(Limited(1))
    entered: list[str] = []
    release = asyncio.Event()

    async def send(tenant: str, n: int) -> None:
        async with gate.slot(provider, tenant):
            entered.append(f"{tenant}{n}")
            if n == 0 and tenant == "a":
                await release.wait()

    first = asyncio.create_task(send("a", 0))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(send("a", n)) for n in range(1, 200)]
    await asyncio.sleep(0)
    late = asyncio.create_task(send("b", 0))
    await asyncio.sleep(0)
    assert gate.waiting(provider) == 2  # two tenants in line
    release.set()
    async with asyncio.timeout(5):
        await asyncio.gather(first, late, *rest)
    assert entered[:3] == ["a0", "a1", "b0"]
    assert entered[3:] == [f"a{n}" for n in range(2, 200)]  # each tenant's own in order
