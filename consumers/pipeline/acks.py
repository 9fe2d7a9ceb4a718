"""Acks of a channel whose deliveries settle out of order: multiple=True where it is safe.

The push runner settles each job once its answers are recorded, while other
jobs of the same channel are still in flight, so jobs settle out of delivery
order. An ack with `multiple=True` and tag N settles every unacked delivery
of the channel up to N; it may go out only once every delivery up to N is
settled. `AckWindow` keeps, per channel, the tags delivered and not yet
passed, in delivery order:

1. `delivered()` on arrival, before any batch takes the delivery: a tag
   still in the loop's buffer holds the window back like one in flight;
2. `settle()` once a job's records committed (its ack) or it was handed
   back (its nack, sent by the caller): the lowest tags that are settled
   are passed, and the highest of them still waiting for its ack is acked
   with `multiple=True`: one frame for all of them. That tag was never acked
   nor nacked, so the broker knows it (a multiple ack naming an unknown tag
   closes the channel); tags below it that were nacked or acked alone
   are simply gone at the broker;
3. settled acks above a delivery still in flight wait at most
   `hold_seconds`, then go one by one: a job on a slow device holds the
   others' acks back that long, never for its whole provider timeout (the
   channel's prefetch would fill with settled deliveries and stall it).

A channel that closed (a reconnect) cannot ack its deliveries any more: the
broker redelivers them, and a redelivered job finds its ledger rows. Its
state is dropped; the new channel counts tags from 1 again.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field

import aio_pika
import structlog

from consumers.pipeline.deliveries import Delivery, Item

log = structlog.get_logger(__name__)

HOLD_SECONDS = 0.2  # longest a settled ack waits behind a delivery still in flight


@dataclass(slots=True)
class _Channel:
    """One channel's delivered tags in order, and those of them settled already."""

    order: deque[int] = field(default_factory=deque)  # delivered, not passed yet
    # Settled, not passed yet: the item whose ack is due, or None (nacked, or acked alone).
    settled: dict[int, Item | None] = field(default_factory=dict)


class AckWindow:
    """The acks of one consuming channel (and its successors after reconnects)."""

    def __init__(self, *, hold_seconds: float = HOLD_SECONDS) -> None:
        self.hold_seconds = hold_seconds
        self._channels: dict[object, _Channel] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: set[asyncio.Task[int]] = set()
        # One settle or flush at a time, from marking to the last frame: a tag
        # marked "acked alone" whose frame had not gone out yet could otherwise
        # be covered by another's multiple ack first, and its own ack then
        # names a tag the broker no longer holds (the channel closes).
        self._lock = asyncio.Lock()

    def delivered(self, delivery: Delivery) -> None:
        """Note a delivery as it arrives, before anything may settle it."""
        tag = delivery.delivery_tag
        if not tag:
            return
        try:
            channel = delivery.channel
        except aio_pika.exceptions.ChannelInvalidStateError:
            return  # closed already: it can never be acked; the broker redelivers it
        state = self._channels.get(channel)
        if state is None:
            self._drop_closed()
            state = self._channels[channel] = _Channel()
        if state.order and tag < state.order[-1]:
            bisect.insort(state.order, tag)  # noted out of order: kept in tag order
        else:
            state.order.append(tag)

    async def settle(self, acks: Iterable[Item], nacked: Iterable[Item] = ()) -> int:
        """Ack `acks` (their records committed); `nacked` were handed back by the caller.

        Returns how many deliveries could not be acked (left to redelivery).
        """
        async with self._lock:
            return await self._settle(acks, nacked)

    async def _settle(self, acks: Iterable[Item], nacked: Iterable[Item]) -> int:
        failed = 0
        due: list[tuple[_Channel, Item]] = []
        for item, ack in [*((i, False) for i in nacked), *((i, True) for i in acks)]:
            found = self._find(item)
            if found is None:
                if ack:  # never noted (a closed channel, or no window before it)
                    failed += not await _ack(item, multiple=False)
                continue
            state, tag = found
            if tag in state.settled or not state.order or tag < state.order[0]:
                continue  # settled twice: the first one counts (its ack is out or due)
            state.settled[tag] = item if ack else None
            if ack:
                due.append((state, item))
        for state in {id(s): s for s, _ in due}.values():
            failed += await self._pass(state)
        if any(s.settled for s in self._channels.values()):
            self._hold()
        return failed

    async def flush(self) -> int:
        """Ack every settled delivery now, alone where a multiple ack is not safe yet."""
        async with self._lock:
            failed = 0
            for state in list(self._channels.values()):
                failed += await self._pass(state)  # the front first: one multiple ack
                # What is left sits above a delivery still in flight: each alone.
                for tag, item in state.settled.items():
                    if item is not None:
                        state.settled[tag] = None
                        failed += not await _ack(item, multiple=False)
            self._drop_closed()
            return failed

    def close(self) -> None:
        """Stop the hold timer (the worker is stopping; `flush()` went first)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def unsettled(self) -> int:
        """Deliveries noted and not settled yet, on every channel (tests read it)."""
        return sum(len(s.order) - len(s.settled) for s in self._channels.values())

    def held(self) -> int:
        """Settled deliveries whose ack has not gone out yet (tests read it)."""
        return sum(i is not None for s in self._channels.values() for i in s.settled.values())

    def _find(self, item: Item) -> tuple[_Channel, int] | None:
        tag = item.delivery.delivery_tag
        try:
            channel = item.delivery.channel
        except aio_pika.exceptions.ChannelInvalidStateError:
            return None
        state = self._channels.get(channel)
        if state is None or not tag:
            return None
        return state, tag

    async def _pass(self, state: _Channel) -> int:
        """Pass the settled tags at the front; ack the highest one due, multiple=True."""
        highest: Item | None = None
        passed = 0
        while state.order and state.order[0] in state.settled:
            item = state.settled.pop(state.order.popleft())
            passed += 1
            if item is not None:
                highest = item
        if highest is None:
            return 0
        if await _ack(highest, multiple=True):
            return 0
        return passed  # the channel closed: every one of them is left to redelivery

    def _hold(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.hold_seconds, self._held_too_long)

    def _held_too_long(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    def _drop_closed(self) -> None:
        for channel in [c for c in self._channels if getattr(c, "is_closed", False)]:
            del self._channels[channel]


async def _ack(item: Item, *, multiple: bool) -> bool:
    """Ack `item` (and, `multiple`, every unacked delivery below it); False if it could not."""
    return await quietly(item.delivery.ack(multiple=multiple), item)


async def quietly(action: Awaitable[object], item: Item) -> bool:
    """Await an ack or nack of `item`; False (and a log line) if it could not go out."""
    try:
        await action
    except Exception as exc:  # a channel closed since delivery: the broker redelivers
        log.warning(
            "ack_failed",
            message_id=item.delivery.message_id,
            error=repr(exc),
            outcome="left_to_redelivery",
        )
        return False
    return True
