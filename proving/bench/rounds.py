"""Runs of the variants, interleaved and repeated, and the paced runs.

A run: empty the effects (and the claims, unless kept), fill the work queue
with its backlog, start the stopwatch, let the variant consume until the
stopwatch has seen every message acked, then check that every writing
variant left exactly one effect row per message. Round k runs every variant
once, in an order rotated by k, so drift on a shared machine (another
process, a checkpoint) spreads over all of them rather than one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import asyncpg

from consumers import Settings
from proving.bench import phases
from proving.bench.memory import peak_resident
from proving.bench.options import BenchOptions
from proving.bench.profile import sampled
from proving.bench.sandbox import Sandbox
from proving.bench.stopwatch import Stopwatch, Timing
from proving.bench.variant import Run, Variant
from proving.bench.workload import publish_backlog
from proving.deadlines import ANSWER_S, within

PACER_START_SECONDS = 1.5  # lets the consumer start before the load does
SETTLE_SECONDS = 1.0


@dataclass(slots=True)
class Result:
    """Every run of one variant."""

    variant: Variant
    timings: list[Timing] = field(default_factory=list)
    peak_mb: float = 0.0
    wrong: list[str] = field(default_factory=list)  # effect counts that were not N

    @property
    def rate(self) -> float:
        return statistics.median(t.rate for t in self.timings) if self.timings else 0.0

    @property
    def p50_ms(self) -> float:
        return _median([t.p50_ms for t in self.timings])

    @property
    def p99_ms(self) -> float:
        return _median([t.p99_ms for t in self.timings])


def _median(values: list[float]) -> float:
    """The median of the timed ones; NaN if none was (see Timing)."""
    timed = [v for v in values if not math.isnan(v)]
    return statistics.median(timed) if timed else math.nan


def say(line: str) -> None:
    print(line, flush=True)


def since(started: float) -> str:
    """Time since `started` (a `time.monotonic()` reading) as `4m07s`."""
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    return f"{minutes}m{seconds:02d}s"


def _ms(value: float) -> str:
    return "        -" if math.isnan(value) else f"{value:7.1f} ms"


class Rounds:
    """The bench's connections, sandbox and stopwatch, and the runs made with them."""

    def __init__(
        self,
        *,
        options: BenchOptions,
        settings: Settings,
        sandbox: Sandbox,
        admin: asyncpg.Connection,
        channel: aio_pika.abc.AbstractChannel,
        watch: Stopwatch,
        progress: Callable[[str], None] = say,
        started: float | None = None,
    ) -> None:
        self.options = options
        self.settings = settings
        self.sandbox = sandbox
        self.admin = admin
        self.channel = channel
        self.watch = watch
        self.progress = progress
        self.started = time.monotonic() if started is None else started  # the bench's start
        self._seed = 0
        self.profiles: list[Path] = []  # py-spy's collapsed stacks, one file per sampled run
        # Around each run's consuming (after its backlog and CHECKPOINT): what the
        # steady bench measures on the server (`proving.bench.steady`).
        self.probe: Callable[[Variant], AbstractAsyncContextManager[None]] | None = None

    def _run(self, messages: int, timeout: float) -> Run:
        return Run(
            sandbox=self.sandbox,
            settings=self.settings,
            messages=messages,
            prefetch=self.options.prefetch,
            watch=self.watch,
            timeout=timeout,
            log_file=self.options.log_file,
        )

    async def _prepare(self, *, keep_claims: bool, backlog: int) -> None:
        queue = await self.channel.get_queue(self.sandbox.queue, ensure=False)
        await queue.purge(timeout=ANSWER_S)
        await self.sandbox.reset(self.admin, keep_claims=keep_claims)
        self._seed += 1
        if backlog:
            await publish_backlog(self.channel, self.sandbox.queue, backlog, seed=self._seed)
        # Let the last run's and the backlog's writes settle (WAL, the quorum
        # queue's log) so that no variant inherits another's hangover.
        await self.admin.execute("CHECKPOINT", timeout=ANSWER_S)
        await asyncio.sleep(SETTLE_SECONDS)

    async def _check(self, variant: Variant, messages: int, result: Result) -> str:
        if not variant.writes:
            return ""
        rows, distinct = await self.sandbox.effects(self.admin)
        if rows == distinct == messages:
            return "effects ok"
        result.wrong.append(f"effects={rows} distinct={distinct} expected={messages}")
        return f"EFFECTS WRONG: {rows} rows, {distinct} distinct, {messages} expected"

    async def once(
        self, variant: Variant, result: Result, *, keep_claims: bool, label: str
    ) -> None:
        """One run of `variant`, its timing added to `result`; `label` begins its line."""
        n = self.options.slow_messages if variant.slow else self.options.messages
        await self._prepare(keep_claims=keep_claims, backlog=n)
        self.watch.reset(n)
        probe = self.probe(variant) if self.probe else contextlib.nullcontext()
        async with peak_resident() as peak, self._sampled(variant), probe:
            # unbounded: _run ends by the round's timeout (options.timeout)
            outside = await variant.consume(self._run(n, self.options.timeout))
        timing = outside or self.watch.timing()
        result.timings.append(timing)
        peak_mb = peak.megabytes if timing.peak_mb is None else timing.peak_mb
        result.peak_mb = max(result.peak_mb, peak_mb)
        verdict = await self._check(variant, n, result)
        self.progress(
            f"{label} {n:>7,} msgs {timing.rate:>8,.0f} msg/s"
            f"  p50 {_ms(timing.p50_ms)}  p99 {_ms(timing.p99_ms)}"
            f"  rss {peak_mb:5.0f} MB  {verdict or '-':<10}  {timing.cpu_shares() or '-':<21}"
            f"  at {since(self.started)}"
        )

    def _sampled(self, variant: Variant) -> AbstractAsyncContextManager[None]:
        if variant.name != self.options.profile:
            return contextlib.nullcontext()
        path = Path(tempfile.gettempdir()) / f"bench-{variant.name}-{len(self.profiles) + 1}.txt"
        self.profiles.append(path)
        return sampled(path)

    async def rounds(
        self, variants: Sequence[Variant], *, keep_claims: bool, phase: str
    ) -> dict[str, Result]:
        results = {v.name: Result(variant=v) for v in variants}
        repeats = self.options.repeats
        for k in range(repeats):
            shift = k % len(variants)
            for variant in [*variants[shift:], *variants[:shift]]:
                await self.once(
                    variant,
                    results[variant.name],
                    keep_claims=keep_claims,
                    label=f"{phase} {variant.name:<20} {k + 1}/{repeats}",
                )
        return results

    async def paced(self, variant: Variant, rate: float) -> Timing:
        """Publish at `rate` from another process for paced_seconds; time the consumer."""
        seconds = self.options.paced_seconds
        rate = float(round(rate))
        expected = int(rate * seconds)
        await self._prepare(keep_claims=False, backlog=0)
        self.watch.reset(expected)
        timed = self.options.phases and variant.name in phases.VARIANTS
        batches = phases.Phases(self.watch)
        with batches.installed() if timed else contextlib.nullcontext(batches):
            timing, pacer = await self._paced_run(variant, rate, seconds, expected)
        sent, cpu_seconds = pacer.split()
        self.progress(
            f"paced {variant.name:<20} at {rate:,.0f} msg/s ({sent} sent,"
            f" the pacer on a CPU {float(cpu_seconds) / seconds:.0%}):"
            f"  p50 {_ms(timing.p50_ms)}  p99 {_ms(timing.p99_ms)}  {timing.cpu_shares()}"
            f"  at {since(self.started)}"
        )
        if timed:
            self.progress(batches.line(variant.name, rate))
        return timing

    async def _paced_run(
        self, variant: Variant, rate: float, seconds: float, expected: int
    ) -> tuple[Timing, str]:
        consumer = asyncio.create_task(
            variant.consume(self._run(expected, seconds + self.options.timeout))
        )
        await asyncio.sleep(PACER_START_SECONDS)
        pacer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proving.bench.pacer",
            self.settings.amqp.url,
            self.sandbox.queue,
            str(rate),
            str(seconds),
            str(self._seed + 1_000_000),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await within(seconds + ANSWER_S, "the pacer's publishes", pacer.communicate())
        await within(ANSWER_S, "the paced consumer after the pacer", consumer)
        return self.watch.timing(), out.decode().strip()
