"""Delivery and ack times of every message, taken the same way for every variant.

The stopwatch wraps two methods of aio-pika's `IncomingMessage` while a run
lasts: its constructor (the moment aio-pika hands a delivery to a consumer,
whatever consumer it is) and `ack()` (the moment the consumer acknowledges;
`multiple=True` covers every earlier delivery of that channel). Our worker
consumes below aio-pika's objects (`consumers.broker.consume`): the same two
methods of its `RawDelivery` are wrapped alike, its constructor called at the
point aio-pika's would be. So the bare loops, FastStream and our worker are
timed by one instrument, and none of them carries timing code of its own.
The anchors on aiormq's own consumer (`proving.bench.anchors`) are timed by
the same counts at aiormq's level, installed while they run
(`aiormq_installed`): the moment aiormq calls the consumer's callback, and
`basic_ack`.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aiormq
from aio_pika.message import IncomingMessage

from consumers.broker.consume import RawDelivery
from proving.bench import schedstat


def quantile(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile of `ordered` (sorted), nearest rank; NaN if empty."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """What one run measured."""

    messages: int
    seconds: float  # first delivery to last ack (`bare`: see proving.bench.untimed)
    p50_ms: float = math.nan  # NaN: not timed message by message (`bare`)
    p99_ms: float = math.nan
    peak_mb: float | None = None  # None: the bench process's own, taken by the run
    # Of `seconds`, how long the consumer's thread ran and waited for a CPU
    # (`proving.bench.schedstat`); None where not measured.
    cpu: schedstat.CpuTimes | None = None

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def cpu_shares(self) -> str:
        """`ran=55% waited=36%`: the consumer thread's share of the run on a CPU and
        waiting for one; empty where not measured."""
        return schedstat.shares(self.cpu, self.seconds)


class _Channel:
    """Deliveries of one channel not acked yet, in delivery-tag order."""

    __slots__ = ("acked_alone", "pending")

    def __init__(self) -> None:
        self.pending: deque[tuple[int, float]] = deque()
        self.acked_alone: set[int] = set()


class Stopwatch:
    """Counts acks up to `expected`; `done` is set by the last one."""

    def __init__(self) -> None:
        self.expected = 0
        self.done = asyncio.Event()
        self._channels: dict[int, _Channel] = {}
        self._latencies: list[float] = []
        self._first = 0.0
        self._last = 0.0
        self._cpu_first: schedstat.CpuTimes | None = None
        self._cpu_last: schedstat.CpuTimes | None = None

    def reset(self, expected: int) -> None:
        self.expected = expected
        self.done = asyncio.Event()
        self._channels = {}
        self._latencies = []
        self._first = 0.0
        self._last = 0.0
        self._cpu_first = None
        self._cpu_last = None

    @property
    def acked(self) -> int:
        return len(self._latencies)

    def span(self) -> tuple[float, float]:
        """(first delivery, last ack), `time.perf_counter()` readings; 0.0 before any."""
        return self._first, self._last

    def oldest_unacked(self, channel: object) -> float | None:
        """When the oldest delivery of `channel` not acked yet was delivered; None if none."""
        state = self._channels.get(id(channel))
        return state.pending[0][1] if state is not None and state.pending else None

    def timing(self) -> Timing:
        latencies = sorted(self._latencies)
        if not latencies:
            return Timing(messages=0, seconds=0.0, p50_ms=0.0, p99_ms=0.0)
        return Timing(
            messages=len(latencies),
            seconds=self._last - self._first,
            p50_ms=statistics.median(latencies) * 1000,
            p99_ms=quantile(latencies, 0.99) * 1000,
            cpu=schedstat.between(self._cpu_first, self._cpu_last),
        )

    def _delivered(self, channel: object, tag: int) -> None:
        now = time.perf_counter()
        if not self._first:
            self._first = now
            self._cpu_first = schedstat.read()
        state = self._channels.get(id(channel))
        if state is None:
            state = self._channels[id(channel)] = _Channel()
        state.pending.append((tag, now))

    def _acked(self, channel: object, tag: int, multiple: bool) -> None:
        now = time.perf_counter()
        state = self._channels.get(id(channel))
        if state is None:
            return
        latencies = self._latencies
        if multiple:
            pending = state.pending
            alone = state.acked_alone
            while pending and pending[0][0] <= tag:
                done_tag, delivered = pending.popleft()
                if done_tag in alone:
                    alone.discard(done_tag)
                else:
                    latencies.append(now - delivered)
        else:
            # Rare in a run but for the per-message ackers: find it, mark it.
            for done_tag, delivered in state.pending:
                if done_tag == tag:
                    latencies.append(now - delivered)
                    state.acked_alone.add(tag)
                    break
            pending = state.pending
            while pending and pending[0][0] in state.acked_alone:
                state.acked_alone.discard(pending.popleft()[0])
        self._last = now
        if self.expected and len(latencies) >= self.expected and not self.done.is_set():
            self._cpu_last = schedstat.read()
            self.done.set()

    @contextmanager
    def installed(self) -> Iterator[Stopwatch]:
        """Wrap aio-pika's IncomingMessage and our RawDelivery for as long as the block runs."""
        watch = self
        originals: list[tuple[type[Any], Callable[..., None], Callable[..., Any]]] = []
        classes: tuple[type[Any], ...] = (IncomingMessage, RawDelivery)
        for cls in classes:
            original_init: Callable[..., None] = cls.__init__
            original_ack: Callable[..., Any] = cls.ack
            originals.append((cls, original_init, original_ack))

            def init(
                message: Any, *args: Any, _init: Callable[..., None] = original_init, **kwargs: Any
            ) -> None:
                _init(message, *args, **kwargs)
                if message.delivery_tag:
                    watch._delivered(args[0].channel, message.delivery_tag)

            async def ack(
                message: Any, multiple: bool = False, _ack: Callable[..., Any] = original_ack
            ) -> None:
                channel = message.channel
                await _ack(message, multiple)
                watch._acked(channel, message.delivery_tag or 0, multiple)

            # A measuring instrument, installed for the bench process only.
            cls.__init__ = init
            cls.ack = ack
        try:
            yield self
        finally:
            for cls, original_init, original_ack in originals:
                cls.__init__ = original_init
                cls.ack = original_ack

    @contextmanager
    def aiormq_installed(self) -> Iterator[Stopwatch]:
        """Wrap aiormq's consumer callbacks and `basic_ack` for as long as the block runs.

        Only around a consumer written on aiormq itself: the worker's and
        aio-pika's deliveries are aiormq's too, and would count twice.
        """
        watch = self
        original_consume: Callable[..., Any] = aiormq.Channel.basic_consume
        original_ack: Callable[..., Any] = aiormq.Channel.basic_ack

        async def basic_consume(
            channel: Any, queue: str, consumer_callback: Callable[..., Any], **kwargs: Any
        ) -> Any:
            async def timed(message: Any) -> None:
                watch._delivered(channel, message.delivery_tag)
                await consumer_callback(message)

            return await original_consume(channel, queue, timed, **kwargs)

        async def basic_ack(
            channel: Any, delivery_tag: int, multiple: bool = False, wait: bool = True
        ) -> None:
            await original_ack(channel, delivery_tag, multiple, wait)
            watch._acked(channel, delivery_tag, multiple)

        # A measuring instrument, installed for the anchor's run only.
        aiormq.Channel.basic_consume = basic_consume  # type: ignore[method-assign, assignment]
        aiormq.Channel.basic_ack = basic_ack  # type: ignore[method-assign, assignment]
        try:
            yield self
        finally:
            aiormq.Channel.basic_consume = original_consume  # type: ignore[method-assign]
            aiormq.Channel.basic_ack = original_ack  # type: ignore[method-assign]
