"""Push sends per second through ONE worker process, every ack after its ledger record.

    python -m proving.bench.push [--sends 10000] [--runs 3] [--sweep]

Per run: a fresh schema and queue; N sends pre-published as push jobs, unique
iOS tokens: one target a job (the single-device shape), and, in the fan-out
variant, 50 to 100 targets a job; one in-process `Worker` whose `app.push_handler` sends to
a fake APNs in a child process (its CPU is not the worker's), answering every
token after 20 ms. Timed from the first delivery to the last ack (aio-pika's
`IncomingMessage` is wrapped for the run); then the database must show every
ledger row `sent` and the fake exactly N requests with N distinct apns-ids.
`provider_only` (ApnsProvider alone, same fake, as many sends at a time as the
provider lets the worker have: its `max_in_flight` once connected, and no fewer
than PROVIDER_CONCURRENCY; a log line per answer, at info, as the worker
writes) runs in every round, so both figures share the machine's weather.
Both sides log at info to --log-file, a real file as production writes one. Each round's
line gives the event loop thread's share of the run on a CPU and waiting for
one (`ran=`, `waited=`), and the fake's (`fake ran=`): a side near 100% set the pace.
Worker settings come from the environment (IW_MAX_BATCH, IW_PREFETCH,
IW_CONCURRENCY); `--sweep` tries a few more. Medians of --runs rounds. The
last line: `push_bench: sends_per_s=... fanout_sends_per_s=... provider_only=...
ratio=... fanout_ratio=...` (each shape's rate over the provider's alone).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import aio_pika
import asyncpg
import structlog

from consumers import (
    App,
    DatabaseSettings,
    RetryPolicy,
    Settings,
    Worker,
    WorkerSettings,
    configure_logging,
    job_message,
    push_job_body,
)
from consumers.broker.topology import declare, delete
from consumers.runtime.collector import collect_less, freeze_started
from dedupe import migrate, quote_ident
from providers import (
    ApnsProvider,
    ApnsSettings,
    Notification,
    Platform,
    Provider,
    Push,
    Target,
    send_ids,
)
from proving.bench import schedstat
from proving.bench.options import DEFAULT_LOG_FILE
from proving.bench.providers import LATENCY, TOKEN, FakeServer
from proving.bench.stopwatch import Stopwatch
from proving.deadlines import ANSWER_S, within

PROVIDER_CONCURRENCY = 500  # the provider-only sender's floor: what a push worker may have
PUBLISH_CHUNK = 500
RUN_TIMEOUT = 600.0


FANOUT_TARGETS = (50, 100)  # targets a job in the fan-out shape, uniformly


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """One worker configuration and job shape to measure."""

    max_batch: int
    prefetch: int  # the push queue's window (`push_prefetch`)
    concurrency: int
    fanout: bool = False

    @property
    def label(self) -> str:
        shape = "fan-out 50-100" if self.fanout else "1 device"
        return (
            f"{shape}: batch={self.max_batch} prefetch={self.prefetch} channels={self.concurrency}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    sends_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_us_per_send: float  # this process' CPU from worker start to the last ack, per send
    duplicates: int
    shares: str = ""  # the event loop thread's share of the run on a CPU and waiting for one


@dataclass(slots=True)
class Results:
    setup: Setup
    runs: list[Timing] = field(default_factory=list)

    def median(self, value: Callable[[Timing], float]) -> float:
        return statistics.median(value(t) for t in self.runs)


def push_app(queue: str, apns: ApnsSettings) -> App:
    app = App()

    async def provider() -> Provider:
        return ApnsProvider(apns)

    app.push_handler(queue, provider=provider, lease_seconds=max(30.0, apns.timeout_seconds * 2))
    return app


def job_sizes(sends: int, fanout: bool) -> list[int]:
    """Targets of each job: N jobs of one, or jobs of 50 to 100 adding up to N."""
    if not fanout:
        return [1] * sends
    rng, sizes = random.Random(sends), list[int]()
    while (left := sends - sum(sizes)) > 0:
        sizes.append(min(left, rng.randint(*FANOUT_TARGETS)))
    return sizes


async def publish_jobs(channel: aio_pika.abc.AbstractChannel, queue: str, sizes: list[int]) -> None:
    """Persistent push jobs of `sizes` unique iOS tokens each, confirmed by the broker."""
    tag = uuid.uuid4().hex[:8]
    exchange = channel.default_exchange
    device = 0
    for start in range(0, len(sizes), PUBLISH_CHUNK):
        messages = []
        for i in range(start, min(len(sizes), start + PUBLISH_CHUNK)):
            targets = []
            for _ in range(sizes[i]):
                targets.append(Target(platform=Platform.IOS, token=f"{tag}{device:08d}{'a' * 48}"))
                device += 1
            body = push_job_body(
                targets=targets,
                title="Your order shipped",
                body="It arrives Friday",
                data={"order": str(i)},
            )
            messages.append(job_message(body, message_id=f"order-{tag}-{i}-shipped"))
        await asyncio.gather(*(exchange.publish(m, routing_key=queue) for m in messages))


async def worker_run(setup: Setup, base: Settings, fake: FakeServer, sends: int) -> Timing:
    """One worker run in a fresh schema and queue; both dropped after."""
    assert isinstance(fake.settings, ApnsSettings)
    tag = uuid.uuid4().hex[:10]
    schema, queue, retry = f"pushbench_{tag}", f"pushbench.{tag}", RetryPolicy()
    settings = replace(
        base,
        database=DatabaseSettings(
            url=base.database.url, schema=schema, pool_size=base.database.pool_size
        ),
        worker=WorkerSettings(
            max_batch=setup.max_batch, push_prefetch=setup.prefetch, concurrency=setup.concurrency
        ),
    )
    admin = await asyncpg.connect(base.database.url, timeout=ANSWER_S)
    connection = await aio_pika.connect(base.amqp.url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        await migrate(admin, schema)
        await declare(channel, queue, retry, base.amqp)
        sizes = job_sizes(sends, setup.fanout)
        await publish_jobs(channel, queue, sizes)
        fake.forget()
        say(f"{len(sizes):,} jobs, {sends:,} sends published; worker starting ({setup.label})")
        clock = Stopwatch()
        clock.reset(len(sizes))
        with clock.installed():
            cpu = time.process_time()
            worker = Worker(push_app(queue, fake.settings), settings)
            await worker.start()
            freeze_started()  # as `idempotent-workers run` does once its worker started
            fake_before, started = fake.cpu(), time.perf_counter()
            try:
                await asyncio.wait_for(clock.done.wait(), RUN_TIMEOUT)
                cpu = time.process_time() - cpu
                fake_shares = _fake_shares(fake_before, fake.cpu(), time.perf_counter() - started)
            finally:
                await worker.stop()
        row = await admin.fetchrow(
            f"SELECT count(*) FILTER (WHERE status = 'sent'), count(*), sum(sends)"
            f" FROM {quote_ident(schema)}.send_ledger",
            timeout=ANSWER_S,
        )
        assert row is not None
        requests, distinct_ids = fake.requests()
        errors = fake.protocol_errors()
        # `sends` counts leases taken: a send that could not start before its
        # lease's deadline (NotStartedInTime), or whose answer was lost with its
        # connection, is leased again; only the first kind is made once.
        if (row[0], row[1], requests) != (sends, sends, sends) or row[2] < sends or errors:
            raise SystemExit(
                f"push_bench: wrong outcome: {row[0]} of {row[1]} rows sent, {row[2]} leases"
                f" taken, {requests} requests at the fake, {sends} sends;"
                f" the fake's HTTP/2 errors: {errors or 'none'}"
            )
        if row[2] > sends:
            say(f"{row[2] - sends} sends leased again (not started before their lease's deadline)")
        timing = clock.timing()
        return Timing(
            sends_per_s=sends / timing.seconds if timing.seconds > 0 else 0.0,
            p50_ms=timing.p50_ms,
            p99_ms=timing.p99_ms,
            cpu_us_per_send=cpu / sends * 1e6,
            duplicates=requests - distinct_ids,
            shares=f"{timing.cpu_shares()} {fake_shares}".strip(),
        )
    finally:
        with contextlib.suppress(Exception):
            await delete(await within(ANSWER_S, "a channel", connection.channel()), queue, retry)
        await admin.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S
        )
        await admin.close()
        await connection.close()


async def provider_run(fake: FakeServer, sends: int) -> tuple[float, str]:
    """The bare provider's sends per second, and its thread's share of the run on a
    CPU and waiting for one (`proving.bench.schedstat`)."""
    assert isinstance(fake.settings, ApnsSettings)
    fake.forget()
    provider = ApnsProvider(fake.settings)
    push = Push(
        target=Target(platform=Platform.IOS, token=TOKEN),
        notification=Notification(title="Your order shipped", body="It arrives Friday"),
    )
    await provider.send(push, send_ids("bench-warm-up", TOKEN))  # connected: its limits known
    in_flight = max(provider.max_in_flight, PROVIDER_CONCURRENCY)
    log = structlog.get_logger("proving.bench.push")
    jobs = iter(range(sends))

    async def sender() -> None:
        for i in jobs:
            receipt = await provider.send(push, send_ids(f"bench-{i}", TOKEN))
            log.info("push_sent", message_id=f"bench-{i}", provider_id=receipt.provider_message_id)

    before, fake_before, started = schedstat.read(), fake.cpu(), time.perf_counter()
    await asyncio.gather(*(sender() for _ in range(in_flight)))
    after, fake_after, seconds = schedstat.read(), fake.cpu(), time.perf_counter() - started
    await provider.aclose()
    ours = schedstat.shares(schedstat.between(before, after), seconds)
    shares = f"in_flight={in_flight} {ours} {_fake_shares(fake_before, fake_after, seconds)}"
    return sends / seconds, shares.strip()


def _fake_shares(
    before: schedstat.CpuTimes | None, after: schedstat.CpuTimes | None, seconds: float
) -> str:
    """`fake ran=95% waited=3%`: the fake APNs's event loop over the same window, which
    says whether it, not the sender, set the pace."""
    shares = schedstat.shares(schedstat.between(before, after), seconds)
    return f"fake {shares}" if shares else ""


async def bench(
    setups: list[Setup], base: Settings, fake: FakeServer, args: argparse.Namespace
) -> None:
    task = asyncio.current_task()
    assert task is not None
    # SIGTERM cancels the bench, so the run's schema and queues are dropped on the way out.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    results = [Results(setup=s) for s in setups]
    provider_rates: list[float] = []
    for round_ in range(args.runs):
        rate, shares = await provider_run(fake, args.provider_sends)
        provider_rates.append(rate)
        say(f"round {round_ + 1}: provider_only {rate:,.0f} sends/s {shares}".rstrip())
        for result in results[round_ % len(results) :] + results[: round_ % len(results)]:
            timing = await worker_run(result.setup, base, fake, args.sends)
            result.runs.append(timing)
            say(
                f"round {round_ + 1}: {result.setup.label}: {timing.sends_per_s:,.0f} sends/s,"
                f" p50 {timing.p50_ms:.0f} ms, p99 {timing.p99_ms:.0f} ms,"
                f" {timing.cpu_us_per_send:.0f} µs CPU/send {timing.shares}".rstrip()
            )
    provider_only = statistics.median(provider_rates)
    say(
        f"\n{args.sends:,} push jobs, fake APNs answering after {LATENCY * 1000:.0f} ms,"
        f" {args.loop} event loop,"
    )
    say(f"medians of {args.runs} runs; provider_only {provider_only:,.0f} sends/s")
    say(
        f"{'worker settings':<40} {'sends/s':>8} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'µs CPU/send':>12} {'dups':>5}"
    )
    for result in results:
        say(
            f"{result.setup.label:<40} {result.median(lambda t: t.sends_per_s):>8,.0f}"
            f" {result.median(lambda t: t.sends_per_s) / provider_only:>6.2f}"
            f" {result.median(lambda t: t.p50_ms):>7.0f} {result.median(lambda t: t.p99_ms):>7.0f}"
            f" {result.median(lambda t: t.cpu_us_per_send):>12.0f}"
            f" {sum(t.duplicates for t in result.runs):>5}"
        )
    single = [r for r in results if not r.setup.fanout] or results
    fanout = [r for r in results if r.setup.fanout] or results
    best = max(single, key=lambda r: r.median(lambda t: t.sends_per_s))
    best_fanout = max(fanout, key=lambda r: r.median(lambda t: t.sends_per_s))
    rate = best.median(lambda t: t.sends_per_s)
    fanout_rate = best_fanout.median(lambda t: t.sends_per_s)
    if len(results) > 2:
        say(f"best: {best.setup.label}; {best_fanout.setup.label}")
    say(
        f"push_bench: sends_per_s={rate:.0f} fanout_sends_per_s={fanout_rate:.0f}"
        f" provider_only={provider_only:.0f} ratio={rate / provider_only:.2f}"
        f" fanout_ratio={fanout_rate / provider_only:.2f}"
        f" p50_ms={best.median(lambda t: t.p50_ms):.0f}"
        f" p99_ms={best.median(lambda t: t.p99_ms):.0f}"
        f" duplicates={sum(t.duplicates for r in (best, best_fanout) for t in r.runs)}"
    )


def say(line: str) -> None:
    print(line, flush=True)


def _loop(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.push", description=__doc__)
    parser.add_argument("--sends", type=int, default=10_000, help="push jobs per run")
    parser.add_argument("--runs", type=int, default=3, help="rounds; figures are medians")
    parser.add_argument("--provider-sends", type=int, default=5_000)
    parser.add_argument("--sweep", action="store_true", help="also try other worker settings")
    parser.add_argument(
        "--shape",
        choices=["both", "single", "fanout"],
        default="both",
        help="job shapes to run (both: the closing line compares them)",
    )
    parser.add_argument(
        "--loop",
        choices=["asyncio", "uvloop"],
        default="asyncio",
        help="the event loop (asyncio: what `idempotent-workers run` uses)",
    )
    parser.add_argument(
        "--log-file",
        default=DEFAULT_LOG_FILE,
        help="where both sides' JSON log lines go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    base = Settings.from_env()
    ws = base.worker
    shapes = {"both": (False, True), "single": (False,), "fanout": (True,)}[args.shape]
    setups = [
        Setup(
            max_batch=ws.max_batch, prefetch=ws.push_prefetch, concurrency=ws.concurrency, fanout=f
        )
        for f in shapes
    ]
    if args.sweep:
        setups += [
            Setup(max_batch=1000, prefetch=2000, concurrency=1),
            Setup(max_batch=200, prefetch=1000, concurrency=1),
            Setup(max_batch=500, prefetch=1000, concurrency=2),
            Setup(max_batch=1000, prefetch=2000, concurrency=2),
        ]
    # The collector as `idempotent-workers run` sets it, for every phase: the bare
    # provider's runs too, so the ratio compares like with like.
    collect_less()
    # Log lines rendered as JSON and written to a file, as in production.
    with open(args.log_file, "wb") as sink:
        configure_logging("info", json=True, file=sink)
        with FakeServer("apns") as fake, asyncio.Runner(loop_factory=_loop(args.loop)) as runner:
            try:
                runner.run(bench(setups, base, fake, args))
            except asyncio.CancelledError:
                raise SystemExit("push_bench: stopped; its schema and queues dropped") from None
    sys.stdout.flush()


if __name__ == "__main__":
    main()
