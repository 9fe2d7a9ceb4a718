"""Webhook sends per second through ONE worker, against bare aiohttp and bare httpx clients
at the same concurrency, to the same receiver, in one run.

    python -m proving.bench.webhooks [--sends 5000] [--runs 3] [--endpoints 1]

The worker side, per round: a fresh schema and queue; an endpoint (or
`--endpoints` K of them: each job fans out to all K) registered through the real
store, its secret encrypted under a key made for the run; N/K webhook jobs
pre-published; one in-process `Worker` whose `app.webhook_handler` signs every
call per the Standard Webhooks specification and sends it through the send ledger
(intent, call, record, then the ack). Timed from the first delivery to the last
ack; then the ledger must show every row `sent` and the receiver N requests with N
distinct webhook-ids.

The bare sides, in the same round: an `aiohttp.ClientSession` (the transport the
worker's sender uses, so the anchor at our own layer) and an `httpx.AsyncClient`,
each with as many connections as the worker's sender (`max_in_flight`, 64 by
default) and as many tasks, each POSTing the same body with the same three
headers, signed by the same `standardwebhooks` library with the same secret, one
log line per answer (as the worker writes one per send). Nothing recorded,
nothing acked: what an application gets from the client alone.

Both sides log at info, as JSON, to --log-file (a real file, as production writes
one). The receiver (`proving.bench.webhook_receiver`) runs in a child process, so
its CPU is neither side's, answers 204 after --latency-ms and verifies nothing;
each round's lines give its share of the run on a CPU (`receiver ran=`): near 100%,
it set the pace. Rounds rotate which side goes first. The last line, medians:
`webhook_bench: worker=... bare=... bare_httpx=... ratio=... paired=... ratio_httpx=...`
(bare: aiohttp's; ratio: of the medians; paired: the median of each round's ratio,
its sides run back to back).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import aio_pika
import aiohttp
import asyncpg
import httpx
import structlog
from cryptography.fernet import Fernet
from standardwebhooks import Webhook

from consumers import (
    App,
    DatabaseSettings,
    RetryPolicy,
    Settings,
    WebhookSettings,
    Worker,
    configure_logging,
    job_message,
    parse_webhook_job,
    webhook_job_body,
)
from consumers.broker.topology import declare, delete
from consumers.jobs.webhook_endpoints import secret_box
from consumers.runtime.collector import collect_less, freeze_started
from dedupe import WebhookEndpoints, migrate, quote_ident
from dedupe.webhook_endpoints import new_secret
from proving.bench import schedstat
from proving.bench.options import DEFAULT_LOG_FILE
from proving.bench.stopwatch import Stopwatch
from proving.bench.webhook_receiver import ReceiverProcess
from proving.deadlines import ANSWER_S, within

IN_FLIGHT = WebhookSettings().max_in_flight  # the worker's default: the bare side's too
PUBLISH_CHUNK = 500
RUN_TIMEOUT = 600.0
TENANT = "bench"


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    rate: float
    shares: str  # the side's event loop thread and the receiver's, over the run


def payload(i: int) -> dict[str, object]:
    return {"order": f"{i}", "carrier": "ups", "items": [{"sku": "A-1", "quantity": 2}]}


def job_body(i: int) -> dict[str, object]:
    return webhook_job_body(event_type="order.shipped", payload=payload(i))


def _receiver_shares(
    receiver: ReceiverProcess, before: schedstat.CpuTimes | None, seconds: float
) -> str:
    shares = schedstat.shares(schedstat.between(before, receiver.cpu()), seconds)
    return f"receiver {shares}" if shares else ""


async def worker_run(
    base: Settings, receiver: ReceiverProcess, *, sends: int, endpoints: int
) -> Round:
    """One worker run in a fresh schema and queue; both dropped after."""
    tag = uuid.uuid4().hex[:10]
    schema, queue, retry = f"hookbench_{tag}", f"hookbench.{tag}", RetryPolicy()
    key = Fernet.generate_key().decode()
    settings = replace(
        base,
        database=DatabaseSettings(
            url=base.database.url, schema=schema, pool_size=base.database.pool_size
        ),
        webhooks=WebhookSettings(secrets_keys=(key,)),
    )
    app = App(retry=retry)
    app.webhook_handler(
        queue,
        settings=WebhookSettings(
            allow_http_hosts=frozenset({"127.0.0.1"}), max_in_flight=IN_FLIGHT
        ),
    )
    admin = await asyncpg.connect(base.database.url, timeout=ANSWER_S)
    connection = await aio_pika.connect(base.amqp.url, timeout=ANSWER_S)
    try:
        channel = await within(ANSWER_S, "a channel", connection.channel(publisher_confirms=True))
        await migrate(admin, schema)
        await declare(channel, queue, retry, base.amqp)
        store, box = WebhookEndpoints(schema), secret_box((key,))
        for n in range(endpoints):
            url = f"{receiver.url}/hooks/{n}"
            await store.add(admin, tenant=TENANT, url=url, event_types=(), box=box)
        jobs = sends // endpoints
        for start in range(0, jobs, PUBLISH_CHUNK):
            messages = [
                job_message(job_body(i), message_id=f"order-{tag}-{i}", tenant=TENANT)
                for i in range(start, min(jobs, start + PUBLISH_CHUNK))
            ]
            exchange = channel.default_exchange
            await asyncio.gather(*(exchange.publish(m, routing_key=queue) for m in messages))
        receiver.forget()
        clock = Stopwatch()
        clock.reset(jobs)
        with clock.installed():
            worker = Worker(app, settings)
            await worker.start()
            freeze_started()  # as `idempotent-workers run` does once its worker started
            before, started = receiver.cpu(), time.perf_counter()
            try:
                await asyncio.wait_for(clock.done.wait(), RUN_TIMEOUT)
                theirs = _receiver_shares(receiver, before, time.perf_counter() - started)
            finally:
                await worker.stop()
        row = await admin.fetchrow(
            f"SELECT count(*) FILTER (WHERE status = 'sent'), count(*)"
            f" FROM {quote_ident(schema)}.send_ledger",
            timeout=ANSWER_S,
        )
        assert row is not None
        requests, distinct = receiver.requests()
        total = jobs * endpoints
        if (row[0], row[1], requests, distinct) != (total, total, total, total):
            raise SystemExit(
                f"webhook_bench: wrong outcome: {row[0]} of {row[1]} rows sent, {requests}"
                f" requests with {distinct} webhook-ids at the receiver, {total} sends"
            )
        timing = clock.timing()
        rate = total / timing.seconds if timing.seconds > 0 else 0.0
        return Round(rate=rate, shares=f"{timing.cpu_shares()} {theirs}".strip())
    finally:
        with contextlib.suppress(Exception):
            await delete(await within(ANSWER_S, "a channel", connection.channel()), queue, retry)
        await admin.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S
        )
        await admin.close()
        await connection.close()


async def bare_run(
    receiver: ReceiverProcess, *, sends: int, endpoints: int, client: str = "aiohttp"
) -> Round:
    """`sends` signed POSTs through `client` (aiohttp or httpx) alone, IN_FLIGHT at a time,
    one log line each."""
    webhook = Webhook(new_secret())
    log = structlog.get_logger("proving.bench.webhooks")
    # The bodies as the worker's jobs hold them, made before the clock starts (the
    # worker's were published before its clock started).
    bodies = [parse_webhook_job(job_body(i)).body.decode() for i in range(sends // endpoints)]
    jobs = iter(range(sends))
    receiver.forget()
    async with contextlib.AsyncExitStack() as stack:
        if client == "httpx":
            limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
            pool = await stack.enter_async_context(
                httpx.AsyncClient(limits=limits, timeout=30.0, trust_env=False)
            )

            async def post(url: str, body: str, headers: dict[str, str]) -> None:
                response = await pool.post(url, content=body, headers=headers)
                response.raise_for_status()

        else:
            session = await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=IN_FLIGHT),
                    timeout=aiohttp.ClientTimeout(total=30.0),
                )
            )

            async def post(url: str, body: str, headers: dict[str, str]) -> None:
                async with session.post(url, data=body, headers=headers) as response:
                    # unbounded: here; the session's ClientTimeout(total=30) ends the whole call
                    await response.read()
                    response.raise_for_status()

        async def sender() -> None:
            for i in jobs:
                body = bodies[i // endpoints]
                message_id = f"msg_{uuid.uuid4().hex}"
                now = datetime.now(UTC)
                headers = {
                    "content-type": "application/json",
                    "webhook-id": message_id,
                    "webhook-timestamp": str(int(now.timestamp())),
                    "webhook-signature": webhook.sign(message_id, now, body),
                }
                await post(f"{receiver.url}/hooks/{i % endpoints}", body, headers)
                log.info("webhook_sent", message_id=f"order-{i}", provider_message_id=message_id)

        before, receiver_before, started = schedstat.read(), receiver.cpu(), time.perf_counter()
        await asyncio.gather(*(sender() for _ in range(IN_FLIGHT)))
        seconds = time.perf_counter() - started
        ours = schedstat.shares(schedstat.between(before, schedstat.read()), seconds)
        theirs = _receiver_shares(receiver, receiver_before, seconds)
    requests, distinct = receiver.requests()
    if (requests, distinct) != (sends, sends):
        raise SystemExit(f"webhook_bench: the bare {client} client's {sends} sends made {requests}")
    return Round(rate=sends / seconds, shares=f"{ours} {theirs}".strip())


async def bench(base: Settings, receiver: ReceiverProcess, args: argparse.Namespace) -> None:
    task = asyncio.current_task()
    assert task is not None
    # SIGTERM cancels the bench, so the run's schema and queues are dropped on the way out.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    rates: dict[str, list[float]] = {"worker": [], "bare": [], "bare_httpx": []}
    sends = args.sends - args.sends % args.endpoints
    order = list(rates)
    for n in range(args.runs):
        for side in order[n % 3 :] + order[: n % 3]:  # each side first, second and third in turn
            if side == "worker":
                done = await worker_run(base, receiver, sends=sends, endpoints=args.endpoints)
            else:
                client = "httpx" if side == "bare_httpx" else "aiohttp"
                done = await bare_run(
                    receiver, sends=sends, endpoints=args.endpoints, client=client
                )
            rates[side].append(done.rate)
            say(f"round {n + 1}: {side} {done.rate:,.0f} sends/s {done.shares}".rstrip())
    worker, bare = rates["worker"], rates["bare"]
    w, b, h = (statistics.median(rates[side]) for side in order)
    # Each round's sides share its weather: the median of their ratios, beside
    # the ratio of the medians, says whether a busy machine moved the latter.
    paired = statistics.median(x / y for x, y in zip(worker, bare, strict=True))
    shape = (
        "a job per webhook" if args.endpoints == 1 else f"each job to {args.endpoints} endpoints"
    )
    say(
        f"\n{sends:,} webhook sends ({shape}), {IN_FLIGHT} in flight,"
        f" receiver answering after {args.latency_ms:g} ms; medians of {args.runs} rounds"
    )
    say(
        f"webhook_bench: worker={w:.0f} bare={b:.0f} bare_httpx={h:.0f} ratio={w / b:.2f}"
        f" paired={paired:.2f} ratio_httpx={w / h:.2f} endpoints={args.endpoints}"
        f" in_flight={IN_FLIGHT}"
    )


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.webhooks", description=__doc__)
    parser.add_argument("--sends", type=int, default=5_000, help="webhook sends per side and round")
    parser.add_argument("--runs", type=int, default=3, help="rounds; figures are medians")
    parser.add_argument(
        "--endpoints", type=int, default=1, help="endpoints each job goes to (default 1)"
    )
    parser.add_argument("--latency-ms", type=float, default=20.0, help="the receiver's answer time")
    parser.add_argument(
        "--log-file",
        default=DEFAULT_LOG_FILE,
        help="where both sides' JSON log lines go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.endpoints < 1 or args.sends < args.endpoints:
        parser.error("--endpoints: at least 1, and no more than --sends")
    base = Settings.from_env()
    # The collector as `idempotent-workers run` sets it, for both sides.
    collect_less()
    with open(args.log_file, "wb") as sink:
        configure_logging("info", json=True, file=sink)
        with (
            ReceiverProcess(latency=args.latency_ms / 1000) as receiver,
            asyncio.Runner() as runner,
        ):
            try:
                runner.run(bench(base, receiver, args))
            except asyncio.CancelledError:
                raise SystemExit("webhook_bench: stopped; its schema and queues dropped") from None
    sys.stdout.flush()


if __name__ == "__main__":
    main()
