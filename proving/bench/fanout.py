"""One send to many devices through ONE worker process: time to the last device, peak RSS.

    python -m proving.bench.fanout [--devices 1000 10000 100000] [--latency-ms 20 100]

Per run: a fresh schema and queue; one `publish_push_job` (one message_id) of N
Android devices; one worker process (`proving.bench.fanout_app`, every setting
at its default: lease 30 s, FCM timeouts 3 s + 10 s, 32 threads) sending to a
fake FCM served by this process, answering every POST after the latency.
Timed from the publish to the last POST the fake received; the run then needs
every ledger row `sent` and exactly N POSTs, one per device. The worker's peak
resident set is its VmHWM (/proc/PID/status) at the end. One line per run:

    fanout_bench: devices=N latency_ms=L parts=P last_device_s=... devices_per_s=...
      worker_peak_rss_mb=... sent_twice=0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import aio_pika
import asyncpg

from consumers import Publisher, RetryPolicy, Settings, publish_push_job, push_job_body
from consumers.broker.topology import delete
from dedupe import migrate, quote_ident
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm, FcmReply
from proving.deadlines import ANSWER_S, within

RUN_TIMEOUT = 1800.0


async def one_run(settings: Settings, devices: int, latency: float, work: Path) -> str:
    schema = f"fanout_{uuid.uuid4().hex[:8]}"
    queue = f"fanout-{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    try:
        await migrate(admin, schema)
        async with FakeApns() as apns, FakeFcm() as fcm:
            fcm.unscripted = FcmReply(latency=latency)
            env = {
                **os.environ,
                **fakes_env(apns, fcm, work, "FANOUT_"),
                "DATABASE_SCHEMA": schema,
                "FANOUT_QUEUE": queue,
            }
            with (work / f"worker-{schema}.log").open("wb") as log:
                worker = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "consumers",
                    "--log-level",
                    "warning",
                    "run",
                    "proving.bench.fanout_app:app",
                    env=env,
                    stdout=log,
                    stderr=log,
                )
                try:
                    line = await _send(settings, admin, schema, queue, fcm, devices, worker.pid)
                finally:
                    worker.terminate()
                    await asyncio.wait_for(worker.wait(), 60)
            return f"{line} latency_ms={latency * 1000:g}"
    finally:
        await admin.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE", timeout=ANSWER_S
        )
        await admin.close()
        await _delete_queues(settings, queue)


async def _send(
    settings: Settings,
    admin: asyncpg.Connection,
    schema: str,
    queue: str,
    fcm: FakeFcm,
    devices: int,
    pid: int,
) -> str:
    table = f"{quote_ident(schema)}.send_ledger"
    targets = [Target(platform=Platform.ANDROID, token=f"bench-{n:07d}") for n in range(devices)]
    body = push_job_body(targets=targets[:1], title="Sale", body="Today only")
    body["targets"] = [{"platform": "android", "token": t.token} for t in targets]
    await _wait_consuming(settings.amqp.urls[0], queue)
    publisher, connection = await within(
        ANSWER_S, "a publisher's connection", Publisher.connect(settings.amqp.urls[0])
    )
    try:
        started = time.monotonic()
        parts = await publish_push_job(publisher, queue, body, message_id="fanout-1")
    finally:
        await connection.close()
    deadline = started + RUN_TIMEOUT
    while (
        await admin.fetchval(
            f"SELECT count(*) FROM {table} WHERE status = 'sent'", timeout=ANSWER_S
        )
        < devices
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"fanout: not every device sent within {RUN_TIMEOUT:g} s")
        await asyncio.sleep(0.5)
    first = min(r.received_at for r in fcm.requests) - started
    last = max(r.received_at for r in fcm.requests) - started
    posts = Counter(r.token for r in fcm.requests)
    twice = sum(n > 1 for n in posts.values())
    if len(posts) != devices:
        raise SystemExit(f"fanout: {len(posts)} devices got a POST, not {devices}")
    return (
        f"fanout_bench: devices={devices} parts={parts} first_device_s={first:.1f}"
        f" last_device_s={last:.1f}"
        f" devices_per_s={devices / last:.0f} worker_peak_rss_mb={_peak_mb(pid):.0f}"
        f" sent_twice={twice}"
    )


async def _wait_consuming(url: str, queue: str) -> None:
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                declared = await (
                    await within(ANSWER_S, "a channel", connection.channel())
                ).declare_queue(queue, passive=True, timeout=ANSWER_S)
                if declared.declaration_result.consumer_count:
                    return
            except aio_pika.exceptions.ChannelClosed:
                pass  # not declared yet
            if time.monotonic() > deadline:
                raise SystemExit("fanout: the worker did not consume within 60 s")
            await asyncio.sleep(0.2)
    finally:
        await connection.close()


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _delete_queues(settings: Settings, queue: str) -> None:
    connection = await aio_pika.connect(settings.amqp.urls[0], timeout=ANSWER_S)
    try:
        await delete(
            await within(ANSWER_S, "a channel", connection.channel()), queue, RetryPolicy()
        )
    finally:
        await connection.close()


async def main_async(devices: list[int], latencies: list[float]) -> None:
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        for latency in latencies:
            for n in devices:
                print(await one_run(settings, n, latency, Path(tmp)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.fanout")
    parser.add_argument("--devices", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[20.0, 100.0])
    args = parser.parse_args(argv)
    asyncio.run(main_async(args.devices, [ms / 1000 for ms in args.latency_ms]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
