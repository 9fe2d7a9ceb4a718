"""`--phases`: where a paced batch's time goes, phase by phase.

While a paced run of `framework` or `framework_batch` lasts, the bench wraps
the calls a batch makes in turn (as the stopwatch wraps the deliveries: the
worker carries no timing code) and times each batch:

- wait: its oldest delivery, from delivered (the stopwatch's clock) to taken
- decode: taken to BEGIN sent (decoding, the held connection taken)
- begin: `HeldConnection.begin`, BEGIN's round trip (none when the batch
  before chained it to its COMMIT: `consumers.pipeline.held`)
- claim: `Inbox.claim`, the claim statement
- effects: the handlers and their staged statements (`BatchRunner._effects_fast`)
- commit: `HeldConnection.commit`, COMMIT's round trip with the WAL flushed
  (and the next batch's BEGIN, when one is waiting)
- settle: `Dispatcher.settle`: republishes, outcome lines, the multiple ack
- batch: taken to acked

BEGIN, the claim and the effects are timed in a batch's first attempt (a
re-run after a lost connection, or the careful path after a handler's
error, is not timed again); COMMIT is timed last, the one that ended the
batch. The paced runs meet neither.

And how busy the loop's one batch slot was: the sum of the batch times over
the span from the first taken to the last acked. A batch loop takes whatever
is buffered as soon as the slot is free, so a slot busy all the time is no
sign of overload; it says that a message waits for the batch in flight
before its own, and that both grow with what one batch costs.

Last, the slowest batch on its own: how long it took, how many messages it
held, how far into the run it was taken, and each of its phases. A p99 far
above the batch's p99 is a stall; its phases say which wait it was in.

    phases: framework at 5,000 msg/s: 3,018 batches of 12 messages (median), slot busy
    77% of 10.0 s; p50/p99 ms: wait 1.6/7.8 decode 0.2/1.4 begin 0.2/1.7 claim 0.5/2.5
    effects 0.4/2.2 commit 0.4/2.4 settle 0.2/1.3 batch 2.0/7.7; slowest 15.4 ms,
    1 message, 0.0 s in: wait 0.2 decode 0.2 begin 0.3 claim 12.6 effects 1.2
    commit 0.5 settle 0.4

(one line in the output; `--variants ceiling,framework --paced-rate 5000
--repeats 1 --messages 2000 --phases` on the 2-core python-svc machine,
2026-12-06 11:09 UTC, 543ee4a: there the slowest was the first
batch, whose claim statement was prepared on its connection).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from aio_pika.exceptions import ChannelInvalidStateError

from consumers.pipeline.batch import BatchRunner
from consumers.pipeline.held import HeldConnection
from consumers.pipeline.settle import Dispatcher
from dedupe.inbox import Inbox
from proving.bench.stopwatch import Stopwatch, quantile

VARIANTS = ("framework", "framework_batch")

# Each phase: the marks it runs between, in a batch's order.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("wait", "delivered", "taken"),
    ("decode", "taken", "begin"),
    ("begin", "begin", "begun"),
    ("claim", "claim", "claimed"),
    ("effects", "effects", "effected"),
    ("commit", "commit", "committed"),
    ("settle", "settle", "settled"),
    ("batch", "taken", "settled"),
)

_batch: ContextVar[dict[str, float] | None] = ContextVar("bench_phases_batch", default=None)


class Phases:
    """Every batch's marks while `installed()` lasts."""

    def __init__(self, watch: Stopwatch) -> None:
        self.watch = watch
        self.batches: list[tuple[int, dict[str, float]]] = []  # (size, marks)

    @contextmanager
    def installed(self) -> Iterator[Phases]:
        """Wrap the batch's calls for as long as the block runs; put them back after."""
        wrapped: list[tuple[type[Any], str, Callable[..., Any]]] = []

        def wrap(cls: type[Any], name: str, before: str, after: str, *, last: bool = False) -> None:
            original = getattr(cls, name)
            wrapped.append((cls, name, original))

            async def timed(*args: Any, **kwargs: Any) -> Any:
                marks = _batch.get()
                if marks is None or (before in marks and not last):  # not a batch's, or again
                    return await original(*args, **kwargs)
                marks[before] = time.perf_counter()
                result = await original(*args, **kwargs)
                marks[after] = time.perf_counter()
                return result

            setattr(cls, name, timed)

        run = BatchRunner.run
        phases = self

        async def timed_run(
            runner: BatchRunner, deliveries: Sequence[Any], started: Callable[[], None]
        ) -> None:
            taken = time.perf_counter()
            marks = {"taken": taken}
            try:
                oldest = phases.watch.oldest_unacked(deliveries[0].channel)
            except (IndexError, ChannelInvalidStateError):  # none, or its channel closed since
                oldest = None
            if oldest is not None:
                marks["delivered"] = oldest
            token = _batch.set(marks)
            try:
                await run(runner, deliveries, started)
            finally:
                _batch.reset(token)
            phases.batches.append((len(deliveries), marks))

        wrapped.append((BatchRunner, "run", run))
        BatchRunner.run = timed_run  # type: ignore[method-assign,assignment]
        wrap(HeldConnection, "begin", "begin", "begun")
        wrap(Inbox, "claim", "claim", "claimed")
        wrap(BatchRunner, "_effects_fast", "effects", "effected")
        wrap(HeldConnection, "commit", "commit", "committed", last=True)  # a re-run's is last
        wrap(Dispatcher, "settle", "settle", "settled")
        try:
            yield self
        finally:
            for cls, name, original in reversed(wrapped):
                setattr(cls, name, original)

    def line(self, variant: str, rate: float) -> str:
        """`phases: framework at 5,000 msg/s: ... p50/p99 ms: wait 3.8/15.2 ...`"""
        done = [(n, m) for n, m in self.batches if "settled" in m]
        if not done:
            return f"phases: {variant} at {rate:,.0f} msg/s: no batch settled"
        span = max(m["settled"] for _, m in done) - min(m["taken"] for _, m in done)
        busy = sum(m["settled"] - m["taken"] for _, m in done)
        parts = []
        for name, start, end in PHASES:
            spans = sorted(m[end] - m[start] for _, m in done if start in m and end in m)
            if spans:
                p50, p99 = statistics.median(spans), quantile(spans, 0.99)
                parts.append(f"{name} {p50 * 1000:.1f}/{p99 * 1000:.1f}")
        size = statistics.median(n for n, _ in done)
        slot = f"slot busy {busy / span:.0%} of {span:.1f} s" if span > 0 else "one batch"
        return (
            f"phases: {variant} at {rate:,.0f} msg/s: {len(done):,} batches of {size:g}"
            f" messages (median), {slot}; p50/p99 ms: {' '.join(parts)}; {_slowest(done)}"
        )


def _slowest(done: Sequence[tuple[int, dict[str, float]]]) -> str:
    """`slowest 171.3 ms, 237 messages, 1.5 s in: wait 34.2 decode 2.7 ...`: the batch
    that took longest from taken to acked, its phases in ms, and when it was taken."""
    first = min(m["taken"] for _, m in done)
    size, marks = max(done, key=lambda batch: batch[1]["settled"] - batch[1]["taken"])
    parts = [
        f"{name} {(marks[end] - marks[start]) * 1000:.1f}"
        for name, start, end in PHASES
        if name != "batch" and start in marks and end in marks
    ]
    took = (marks["settled"] - marks["taken"]) * 1000
    held = f"{size} message{'' if size == 1 else 's'}"
    return f"slowest {took:.1f} ms, {held}, {marks['taken'] - first:.1f} s in: {' '.join(parts)}"
