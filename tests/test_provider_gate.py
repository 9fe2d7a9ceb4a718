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
