"""The push bench's web variant: Web Push sends per second through ONE worker, against a
bare pywebpush sender at the same concurrency, to the same push service, in one run.

    python -m proving.bench.push --platform web [--sends 5000] [--runs 3]

The push service is `proving.bench.webpush_baseline`'s: `FakeWebPush(checks=False)`
in a child process (its CPU is neither side's), answering every request after
20 ms, with SUBSCRIPTIONS subscriptions. The worker side, per round: a fresh schema
and queue, N push jobs of one subscription each (in turn), one in-process `Worker`
whose `app.push_handler` sends through `WebPushProvider` (a VAPID JWT per origin,
the payload encrypted per subscription, the ledger's intent, call and record, then
the ack); timed from the first delivery to the last ack; the ledger must show
every row `sent` and the service N requests. The bare side, in the same round:
`pywebpush.webpush_async` as its documentation shows it (a JWT signed and the
payload encrypted per send, one aiohttp session), as many at a time as the
provider's `max_in_flight` (its connections), a log line per answer. Both sides log at
info to --log-file. Rounds alternate which goes first. The last line, medians:
`push_bench_web: worker=... bare=... ratio=... paired=...` (ratio: of the medians;
paired: the median of each round's ratio).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import uuid
from dataclasses import replace

import aio_pika
import asyncpg

from consumers import (
    App,
    DatabaseSettings,
    RetryPolicy,
    Settings,
    Worker,
    configure_logging,
    job_message,
    push_job_body,
)
from consumers.broker.topology import declare, delete
from consumers.runtime.collector import collect_less, freeze_started
from dedupe import migrate, quote_ident
from providers import Provider
from providers.fakes.webpush import FakeWebPush
from providers.webpush import WebPushProvider, WebPushSettings
from proving.bench.push import PUBLISH_CHUNK, RUN_TIMEOUT, say
from proving.bench.stopwatch import Stopwatch
from proving.bench.webpush_baseline import LATENCY, SUBSCRIPTIONS, FakeProcess, Served, bare_run
from proving.deadlines import ANSWER_S, within

LOCAL = frozenset({"127.0.0.1"})


def sender_settings(served: Served) -> WebPushSettings:
    return FakeWebPush.sender_settings(
        vapid_private_key=served.vapid_private_key, subject=served.subject, ca_file=served.ca_file
    )


async def worker_run(base: Settings, fake: FakeProcess, sends: int) -> tuple[float, str]:
    """One worker run in a fresh schema and queue; both dropped after."""
    served = fake.served
    tag = uuid.uuid4().hex[:10]
    schema, queue, retry = f"webbench_{tag}", f"webbench.{tag}", RetryPolicy()
    settings = replace(
        base,
        database=DatabaseSettings(
            url=base.database.url, schema=schema, pool_size=base.database.pool_size
        ),
        worker=replace(base.worker, webpush_allow_hosts=LOCAL),
    )
    app = App(retry=retry)

    async def provider() -> Provider:
        return WebPushProvider(sender_settings(served))

    app.push_handler(queue, provider=provider)
    admin = await asyncpg.connect(base.database.url, timeout=ANSWER_S)
    connection = await aio_pika.connect(base.amqp.url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        await migrate(admin, schema)
        await declare(channel, queue, retry, base.amqp)
        for start in range(0, sends, PUBLISH_CHUNK):
            messages = []
            for i in range(start, min(sends, start + PUBLISH_CHUNK)):
                target = served.targets[i % len(served.targets)]
                body = push_job_body(
                    targets=[target],
                    title="Your order shipped",
                    body="It arrives Friday",
                    allow_hosts=LOCAL,
                )
                messages.append(job_message(body, message_id=f"order-{tag}-{i}-shipped"))
            exchange = channel.default_exchange
            await asyncio.gather(*(exchange.publish(m, routing_key=queue) for m in messages))
        fake.requests()  # forget the earlier runs'
        clock = Stopwatch()
        clock.reset(sends)
        with clock.installed():
            worker = Worker(app, settings)
            await worker.start()
            freeze_started()  # as `idempotent-workers run` does once its worker started
            try:
                await asyncio.wait_for(clock.done.wait(), RUN_TIMEOUT)
            finally:
                await worker.stop()
        row = await admin.fetchrow(
            f"SELECT count(*) FILTER (WHERE status = 'sent'), count(*)"
            f" FROM {quote_ident(schema)}.send_ledger",
            timeout=ANSWER_S,
        )
        assert row is not None
        requests = fake.requests()
        if (row[0], row[1], requests) != (sends, sends, sends):
            raise SystemExit(
                f"push_bench_web: wrong outcome: {row[0]} of {row[1]} rows sent,"
                f" {requests} requests at the push service, {sends} sends"
            )
        timing = clock.timing()
        return sends / timing.seconds if timing.seconds > 0 else 0.0, timing.cpu_shares()
    finally:
        with contextlib.suppress(Exception):
            await delete(await within(ANSWER_S, "a channel", connection.channel()), queue, retry)
        await admin.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S
        )
        await admin.close()
        await connection.close()


async def bare(fake: FakeProcess, sends: int, concurrency: int) -> float:
    fake.requests()  # forget the earlier runs'
    rate = await bare_run(fake.served, sends, concurrency, log=True)
    requests = fake.requests()
    if requests != sends:
        raise SystemExit(f"push_bench_web: the bare sender's {sends} sends made {requests}")
    return rate


async def bench(base: Settings, fake: FakeProcess, args: argparse.Namespace) -> None:
    concurrency = sender_settings(fake.served).max_connections  # the provider's max_in_flight
    worker: list[float] = []
    bare_rates: list[float] = []
    for n in range(args.runs):
        for side in ("bare", "worker") if n % 2 == 0 else ("worker", "bare"):
            if side == "bare":
                bare_rates.append(await bare(fake, args.sends, concurrency))
                say(f"round {n + 1}: bare pywebpush {bare_rates[-1]:,.0f} sends/s")
            else:
                rate, shares = await worker_run(base, fake, args.sends)
                worker.append(rate)
                say(f"round {n + 1}: worker {rate:,.0f} sends/s {shares}".rstrip())
    w, b = statistics.median(worker), statistics.median(bare_rates)
    paired = statistics.median(x / y for x, y in zip(worker, bare_rates, strict=True))
    say(
        f"\n{args.sends:,} web push jobs (one subscription each, {SUBSCRIPTIONS} subscriptions),"
        f" {concurrency} in flight, push service answering after {LATENCY * 1000:.0f} ms;"
        f" medians of {args.runs} rounds"
    )
    say(
        f"push_bench_web: worker={w:.0f} bare={b:.0f} ratio={w / b:.2f} paired={paired:.2f}"
        f" in_flight={concurrency}"
    )


def run_web(args: argparse.Namespace) -> None:
    """`python -m proving.bench.push --platform web` (`--sends`, `--runs`, `--log-file`)."""
    collect_less()  # the collector as `idempotent-workers run` sets it, for both sides
    with open(args.log_file, "wb") as sink:
        configure_logging("info", json=True, file=sink)
        with FakeProcess() as fake, asyncio.Runner() as runner:
            runner.run(bench(Settings.from_env(), fake, args))
