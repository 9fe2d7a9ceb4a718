"""`idempotent-workers bench`: our worker beside the broker's bare speed and its rivals.

In one process, on the services of AMQP_URL and DATABASE_URL, in a schema
and a queue of its own (dropped after): for each variant, pre-publish
--messages persistent ~300-byte JSON jobs (--slow-messages for the slow
rivals, whose rate, not their backlog, is what matters), then time first
delivery to last ack and every message's delivery-to-ack latency; variants
interleaved, --repeats runs each, medians, a progress line per run. Then a
paced mode (p99 at half the framework's rate, load from another process)
and, with --prefill ROWS, the framework again over a processed_messages of
that many rows. Last, the sending side (`proving.bench.sending`): the
publisher one confirm at a time and pipelined, and the outbox relay, with
its own paced latency. The default takes about 5 minutes on 2 cores; --long
runs every variant with LONG_MESSAGES.

Every variant but one is measured in the bench process, the same way
(`proving.bench.stopwatch`), and reads the broker's frames the way the
worker does (`consumers.broker.frames`, installed before the first run, so
no variant's runs differ by which of them came before the worker's first
connect); `bare` runs in a process of its own with aiormq's own reader and
no instrument, and is timed by the queue's depth (`proving.bench.untimed`).
The last line of the table is the summary:

    bench: ceiling=… bare=… naive=… … framework/ceiling=… framework/bare=… …
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any

import aio_pika
import asyncpg

from consumers import Settings, configure_logging
from consumers.broker.frames import install as install_frame_reader
from consumers.runtime.collector import collect_less
from proving.bench.options import (
    LONG_MESSAGES,
    PACED_VARIANTS,
    PREFILL_VARIANTS,
    SLOW_VARIANTS,
    BenchOptions,
    EventLoop,
    parse,
)
from proving.bench.prefill import prefill
from proving.bench.profile import top
from proving.bench.report import paced_line, prefill_line, summary, table
from proving.bench.rounds import Result, Rounds, say, since
from proving.bench.sandbox import Sandbox
from proving.bench.sending import sending_bench
from proving.bench.stopwatch import Stopwatch, Timing
from proving.bench.variant import Variant
from proving.deadlines import ANSWER_S, within


def catalog(names: Sequence[str]) -> list[Variant]:
    """The variants called `names`, in that order; FastStream's only if installed."""
    from proving.bench import anchors, bare, ours, untimed

    known = {
        v.name: v for v in (*bare.VARIANTS, *untimed.VARIANTS, *anchors.VARIANTS, *ours.VARIANTS)
    }
    try:
        from proving.bench import rival
    except ImportError:
        say("faststream is not installed (pip install 'idempotent-workers[bench]'): skipped")
    else:
        known.update({v.name: v for v in rival.VARIANTS})
    return [known[name] for name in names if name in known]


async def _versions(admin: asyncpg.Connection, connection: Any) -> str:
    postgres = await admin.fetchval("SHOW server_version", timeout=ANSWER_S)
    try:
        props = connection.transport.connection.server_properties
        rabbit = props["version"]
        rabbit = rabbit.decode() if isinstance(rabbit, bytes) else rabbit
    except (AttributeError, KeyError, TypeError):
        rabbit = "?"
    return (
        f"python {platform.python_version()}, {os.cpu_count()} cores,"
        f" RabbitMQ {rabbit}, PostgreSQL {postgres}, aio-pika {aio_pika.__version__}"
    )


def _counts(options: BenchOptions) -> str:
    slow = [name for name in options.variants if name in SLOW_VARIANTS]
    line = f"bench: {options.messages:,} messages per run"
    if slow and options.slow_messages != options.messages:
        line += (
            f", {options.slow_messages:,} for the slow ones ({', '.join(slow)}):"
            " their rate, and so their ratios, is what matters, not their backlog"
        )
    if not options.long:
        line += f" (--long: every variant, {LONG_MESSAGES:,} messages each)"
    return line


def _fewer(options: BenchOptions, results: Mapping[str, Result]) -> str:
    slow = [name for name, result in results.items() if result.variant.slow]
    if not slow or options.slow_messages == options.messages:
        return ""
    return (
        f"{', '.join(slow)}: {options.slow_messages:,} messages a run, the others"
        f" {options.messages:,}; rates and ratios compare, latencies (which grow with"
        " the backlog) do not"
    )


async def bench(options: BenchOptions, settings: Settings) -> int:
    started = time.monotonic()
    install_frame_reader()  # every in-process variant on the worker's reader (the docstring)
    amqp = replace(settings.amqp, queue_type=options.queue_type or settings.amqp.queue_type)
    sandbox = Sandbox.fresh(amqp)
    worker_settings = Settings(
        amqp=amqp,
        database=replace(settings.database, schema=sandbox.schema),
        worker=replace(settings.worker, prefetch=options.prefetch),
    )
    variants = catalog(options.variants)
    admin = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    connection = await aio_pika.connect(amqp.url, timeout=ANSWER_S)
    wrong: list[str] = []
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        await sandbox.create(admin, channel)
        say(f"bench: {await _versions(admin, connection)}, event loop {options.loop}")
        say(_counts(options))
        say(
            f"bench: {options.repeats} runs per variant, {amqp.queue_type} queue,"
            f" prefetch {options.prefetch}, logs to {options.log_file}, schema {sandbox.schema}"
        )
        with Stopwatch().installed() as watch:
            rounds = Rounds(
                options=options,
                settings=worker_settings,
                sandbox=sandbox,
                admin=admin,
                channel=channel,
                watch=watch,
                started=started,
            )
            results = (
                await rounds.rounds(variants, keep_claims=False, phase="run") if variants else {}
            )
            wrong += [w for r in results.values() for w in r.wrong]
            if results:
                say("")
                say(table(results))
                if note := _fewer(options, results):
                    say(note)
                say("")
                say(summary(results))
            if rounds.profiles:
                say(f"profile of {options.profile}: {', '.join(map(str, rounds.profiles))}")
                say(top(rounds.profiles))
            framework = results.get("framework")
            fixed = options.paced_rate
            rate = fixed if fixed is not None else framework.rate / 2 if framework else None
            if options.paced_seconds > 0 and rate is not None:
                paced: dict[str, Timing] = {}
                for variant in variants:
                    if variant.name in PACED_VARIANTS:
                        paced[variant.name] = await rounds.paced(variant, rate)
                say(paced_line(rate, paced, fixed=fixed is not None))
            if options.prefill > 0:
                seconds = await prefill(
                    settings.database.url,
                    schema=sandbox.schema,
                    consumer=sandbox.queue,
                    rows=options.prefill,
                    progress=say,
                )
                full = await rounds.rounds(
                    [v for v in variants if v.name in PREFILL_VARIANTS],
                    keep_claims=True,
                    phase="prefilled",
                )
                wrong += [w for r in full.values() for w in r.wrong]
                say(prefill_line(options.prefill, seconds, results, full))
        say("")
        wrong += await sending_bench(options, worker_settings, sandbox, admin, channel, started)
    finally:
        try:
            await sandbox.drop(admin, await within(ANSWER_S, "a channel", connection.channel()))
        finally:
            await connection.close()
            await admin.close()
    for line in wrong:
        say(f"bench: WRONG {line}")
    say(f"bench: done in {since(started)}")
    return 1 if wrong else 0


def _run(main: Coroutine[Any, Any, int], loop: EventLoop) -> int:
    if loop is EventLoop.UVLOOP:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


def main(argv: Sequence[str], settings: Settings) -> int:
    """Entry point of `idempotent-workers bench`."""
    options = parse(argv)
    if options.scale:
        from proving.bench.scale import main as scale_main

        return scale_main(argv, settings)
    # The collector as `idempotent-workers run` sets it, for every variant alike.
    collect_less()
    with open(options.log_file, "wb") as log_file:
        configure_logging("info", json=True, file=log_file)
        code = _run(bench(options, settings), options.loop)
    sys.stdout.flush()
    return code
