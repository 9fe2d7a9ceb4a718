"""One channel's batch loop: deliveries buffered as they arrive, settled a batch at a time.

A loop takes everything buffered (up to `max_batch`) as soon as a batch slot is
free: no timer, so a quiet queue gets the latency of one commit and a busy one
gets large batches. Each batch goes to `run_isolating` (pipeline.isolation),
which never hands a whole batch back for one message. An effects queue's loop
takes by weight too (`consumers.pipeline.holding`): its batches hold at most
that many targets, the rest wait in the buffer; and by tenant
(`consumers.pipeline.tenants`): its buffer has a line per tenant, taken from in
turn, so a tenant's heavy job that does not fit is passed over for the next
tenant's.

An effects queue's loop runs several batches at once, so that a slow device
holds back only its own. Taking whatever is buffered whenever one of them ends
made batches of a few jobs under load, each paying a claim and a recording
transaction. So while one batch is starting (taken, its first answers not yet
recorded), the next is taken only once the buffer holds a full batch, a light
tenant (one holding less than the tenant holding the most,
`Holding.light`) has a delivery waiting, or that start ends: at its first
recording, its end, or after STARTING_SECONDS, the longest a silent device's
batch holds the next one back. One batch slot more than `at_once` is kept for
light tenants: a tenant whose jobs fill every other slot (each held until its
last answer is recorded) does not make another's one push wait for one of them
to end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

import aio_pika
import structlog

from consumers.pipeline.deliveries import Delivery
from consumers.pipeline.holding import Holding
from consumers.pipeline.isolation import run_isolating
from consumers.pipeline.runner import Runner
from consumers.pipeline.tenants import TenantBuffer
from consumers.telemetry.metrics import ConsumerMetrics

log = structlog.get_logger(__name__)

# A consumer's cancel at stop: milliseconds from a broker that is there.
CANCEL_TIMEOUT_SECONDS = 5.0
# The longest one push batch's start holds the next back: about three times the
# take-to-first-recording of a full batch at full load (p90 0.38 s in the push
# bench, 2026-12-05), far below a provider's answer timeout (10 s for APNs).
STARTING_SECONDS = 1.0


class BatchLoop:
    """One channel's deliveries, settled one batch at a time, or `at_once` at a time.

    Local-effect batches go one at a time (their acks are `multiple=True`). A push
    runner settles each job on its own as its answers are recorded, its acks
    through its `acks` window (`consumers.pipeline.acks`), so several of its batches may
    be in flight: a job waiting on a slow device then holds back no batch behind
    it. The window notes each delivery as it arrives, before any batch takes it.
    """

    def __init__(
        self,
        runner: Runner,
        max_batch: int,
        metrics: ConsumerMetrics,
        *,
        at_once: int = 1,
        holding: Holding | None = None,
    ) -> None:
        self.runner = runner
        self.max_batch = max_batch
        self.metrics = metrics
        self.holding = holding  # the weight its batches may hold (an effects queue's targets)
        self.in_flight = 0  # this loop's share of the consumer's in-flight gauge
        # Each delivery with its weight: one line (local effects: acked in order), or a
        # line per tenant (an effects queue's, which settles its jobs one by one).
        self.buffer: deque[tuple[Delivery, int]] | TenantBuffer = (
            deque() if holding is None else TenantBuffer()
        )
        self.wake = asyncio.Event()  # a delivery, a release of held weight, a start's end
        self.stopping = False
        self.queue: aio_pika.abc.AbstractQueue | None = None
        self.consumer_tag: str | None = None
        # The slot kept for light tenants: an effects loop's, on top of `at_once`.
        self._free = at_once if holding is None else at_once + 1
        self._slots = asyncio.Semaphore(self._free)
        if holding is not None:
            holding.watching(self.wake)
        self._running: set[asyncio.Task[None]] = set()
        self._hold_back = at_once > 1  # one at a time: the slot holds the next back already
        self._starting = 0  # batches taken whose start has not ended
        self.acks = runner.acks

    def on_delivery(self, delivery: Delivery) -> None:
        """Buffer a delivery as it is read (`consumers.broker.consume.DirectConsumer`)."""
        if self.acks is not None:
            self.acks.delivered(delivery)
        weight = 1 if self.holding is None else self.holding.weigh(delivery)
        self.buffer.append((delivery, weight))
        self.wake.set()

    def next_batch_waiting(self) -> bool:
        """Deliveries are buffered for the next batch (a local-effect runner begins its
        transaction with the last one's COMMIT then)."""
        return bool(self.buffer)

    async def run(self) -> None:
        try:
            while True:
                if not self.buffer:
                    if self.stopping:
                        return
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                if self._held_back():  # a delivery or the start's end wakes us
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                await self._slots.acquire()  # a batch in flight ended, or none is
                self._free -= 1
                self.wake.clear()  # what comes after this look wakes the wait below
                batch = self._take(light_only=self.holding is not None and not self._free)
                if not batch:  # drained while waiting for a slot, all stale, or no room
                    self._release_slot(wake=False)
                    if self.buffer and self.holding is not None:
                        # A job held settles (room), or a light tenant's delivery arrives.
                        await self.wake.wait()
                    continue
                self._count_in_flight(len(self.buffer))
                self.metrics.batch_messages.observe(len(batch))
                task = asyncio.create_task(self._settle(batch, self._start()))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
        except asyncio.CancelledError:
            for task in self._running:  # past the grace period: stop them too
                task.cancel()
            raise
        finally:
            try:
                if self._running:  # stopping: settle the batches in flight first
                    await asyncio.gather(*self._running, return_exceptions=True)
                if self.acks is not None:  # acks held back behind what is left unsettled
                    await self.acks.flush()
                    self.acks.close()
            finally:
                await self.runner.close()  # the pool closes once its connections are back

    def _held_back(self) -> bool:
        """A batch is starting, the buffer holds less than a full one, and no light
        tenant waits in it."""
        return (
            self._hold_back
            and self._starting > 0
            and len(self.buffer) < self.max_batch
            and not self.stopping
            and not self._light_waiting()
        )

    def _light_waiting(self) -> bool:
        """A light tenant (`Holding.light`) has a delivery in the buffer."""
        holding, buffer = self.holding, self.buffer
        if holding is None or not isinstance(buffer, TenantBuffer):
            return False
        return any(holding.light(tenant) for tenant in buffer.tenants())

    def _release_slot(self, *, wake: bool = True) -> None:
        self._free += 1
        self._slots.release()
        if wake:  # a take refused for want of a regular slot may go now
            self.wake.set()

    def _start(self) -> Callable[[], None]:
        """Count a batch taken now as starting; return what ends its start (once)."""
        if not self._hold_back:
            return _nothing
        self._starting += 1
        ended = False

        def end() -> None:
            nonlocal ended
            if not ended:
                ended = True
                timer.cancel()
                self._starting -= 1
                self.wake.set()

        timer = asyncio.get_running_loop().call_later(STARTING_SECONDS, end)
        return end

    def _take(self, *, light_only: bool = False) -> list[Delivery]:
        """Up to `max_batch` deliveries that fit the holding (if any), skipping those of a
        channel closed since; with `light_only` (the last slot), only deliveries of
        light tenants.

        The broker took those back when their channel closed and redelivers
        them on the new one: run anyway, each would cost a handler call and an
        ack that cannot go out, and the redelivered copies would wait behind
        them (a reconnect adds a whole prefetch each time).
        """
        holding, buffer = self.holding, self.buffer
        if holding is None or isinstance(buffer, deque):
            assert isinstance(buffer, deque)
            taken = [buffer.popleft()[0] for _ in range(min(self.max_batch, len(buffer)))]
        else:

            def admit(delivery: Delivery, weight: int, tenant: str) -> bool:
                if light_only and not holding.light(tenant):
                    return False
                if not holding.admits(weight, tenant):
                    return False  # waits in the buffer, unacked, for room
                holding.take(delivery, weight, tenant)
                return True

            taken = buffer.take(self.max_batch, admit)
        batch: list[Delivery] = []
        stale: list[Delivery] = []
        for delivery in taken:
            try:
                delivery.channel  # noqa: B018 -- raises once the channel has closed
            except aio_pika.exceptions.ChannelInvalidStateError:
                stale.append(delivery)
                continue
            batch.append(delivery)
        if stale:
            if holding is not None:
                holding.release(stale)
            log.info(
                "stale_deliveries_dropped",
                consumer=self.runner.spec.queue,
                count=len(stale),
                outcome="left_to_redelivery",
            )
        return batch

    async def _settle(self, batch: list[Delivery], started: Callable[[], None]) -> None:
        try:
            await run_isolating(self.runner, batch, started)  # never hands a whole batch back
        finally:
            started()  # if the runner did not say so before
            if self.holding is not None:  # what the runner did not give back already
                self.holding.release(batch)
            self._release_slot()
            self._count_in_flight(len(self.buffer))

    def _count_in_flight(self, now: int) -> None:
        """Move the gauge by this loop's change: several loops share one consumer's gauge."""
        if now != self.in_flight:
            self.metrics.in_flight.inc(now - self.in_flight)
            self.in_flight = now

    async def cancel(self) -> None:
        self.stopping = True
        if self.queue is not None and self.consumer_tag is not None:
            # A robust channel whose connection is down waits for it to be back
            # before it sends anything: a broker that is gone would hold the stop
            # for as long as it stays gone. Its consumers went with the connection.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CANCEL_TIMEOUT_SECONDS):
                    await self.queue.cancel(self.consumer_tag)
        self.wake.set()


def _nothing() -> None:
    """The start of a batch nothing waits on."""
