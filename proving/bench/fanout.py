"""One send to many devices through one or more worker processes: time to the last device,
peak RSS.

    python -m proving.bench.fanout [--devices 1000 10000 100000] [--latency-ms 20 100]
        [--platform android ios] [--workers 1 2] [--join-after 0] [--profile N]

Per run: a fresh schema and queue; one `publish_push_job` (one message_id) of N
devices of one platform (its parts go to the queue's bulk lane); W worker
processes (`proving.bench.fanout_app`, every setting at its default: lease
30 s, provider timeouts 10 s, FCM's and APNs' connection limits) sending to a
fake FCM or APNs served by this process, answering every request after the
latency. The first worker consumes before the publish; the others start with
it, or `--join-after S` seconds after the publish (a send under way). Each worker
sends to fakes of its own, so the devices each sent are counted apart. Timed
from the publish to the last request a fake received; the run then needs
every ledger row `sent` and exactly N requests, one per device. Each worker's
peak resident set is its VmHWM (/proc/PID/status) at the end. One line per
run, with the 1-minute load average at its start and end (the machine may be
shared):

    fanout_bench: platform=P devices=N workers=W join_after_s=S parts=...
      first_device_s=... last_device_s=... devices_per_s=... sent_by_worker=a,b
      worker_peak_rss_mb=a,b sent_twice=0 load=x,y latency_ms=L
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import aio_pika
import asyncpg

from consumers import Publisher, RetryPolicy, Settings, publish_push_job, push_job_body
from consumers.broker.topology import delete
from dedupe import migrate, quote_ident
from providers import Platform, Target
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.env import fakes_env
from providers.fakes.fcm import FakeFcm, FcmReply
from proving.bench.profile import sampled, top
from proving.deadlines import ANSWER_S, within

RUN_TIMEOUT = 1800.0


class Run:
    """One run's schema, queue, worker processes and their fakes (one APNs and one FCM
    per worker, so each fake's requests are one worker's)."""

    def __init__(self, settings: Settings, platform: Platform, latency: float, work: Path) -> None:
        self.settings = settings
        self.platform = platform
        self.latency = latency
        self.work = work
        self.schema = f"fanout_{uuid.uuid4().hex[:8]}"
        self.queue = f"fanout-{uuid.uuid4().hex[:8]}"
        self.workers: list[asyncio.subprocess.Process] = []
        self.fakes: list[tuple[FakeApns, FakeFcm]] = []

    def received(self) -> list[list[tuple[str, float]]]:
        """Per worker, (token, when read) of each request its fake read."""
        ios = self.platform is Platform.IOS
        return [
            [(r.token, r.received_at) for r in (apns.requests if ios else fcm.requests)]
            for apns, fcm in self.fakes
        ]

    async def start_worker(self, stack: contextlib.AsyncExitStack) -> None:
        n = len(self.workers)
        apns = await stack.enter_async_context(FakeApns(unscripted=ApnsReply(latency=self.latency)))
        fcm = await stack.enter_async_context(FakeFcm())
        fcm.unscripted = FcmReply(latency=self.latency)
        self.fakes.append((apns, fcm))
        keys = self.work / f"{self.schema}-{n}"  # each fake APNs signs with a key of its own
        keys.mkdir()
        env = {
            **os.environ,
            **fakes_env(apns, fcm, keys, "FANOUT_"),
            "DATABASE_SCHEMA": self.schema,
            "FANOUT_QUEUE": self.queue,
        }
        log = (self.work / f"worker-{self.schema}-{n}.log").open("wb")
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "consumers", "--log-level", "warning", "run", "proving.bench.fanout_app:app"),
            env=env,
            stdout=log,
            stderr=log,
        )
        self.workers.append(worker)

    async def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.returncode is None:
                worker.terminate()
        for worker in self.workers:
            await asyncio.wait_for(worker.wait(), 60)


async def one_run(
    settings: Settings,
    platform: Platform,
    devices: int,
    latency: float,
    workers: int,
    join_after: float,
    work: Path,
    profile: Path | None = None,
) -> str:
    run = Run(settings, platform, latency, work)
    admin = await asyncpg.connect(settings.database.url, timeout=ANSWER_S)
    load = os.getloadavg()[0]
    try:
        await migrate(admin, run.schema)
        async with contextlib.AsyncExitStack() as stack:
            try:
                together = workers if join_after <= 0 else 1
                for _ in range(together):
                    await run.start_worker(stack)
                await _wait_consuming(settings.amqp.urls[0], run.queue, together)
                if profile is None:
                    line = await _send(run, stack, admin, devices, workers, join_after)
                else:  # the first worker, sampled from before the publish to the last device
                    async with sampled(profile, run.workers[0].pid):
                        line = await _send(run, stack, admin, devices, workers, join_after)
            finally:
                await run.stop_workers()
            return f"{line} load={load:.1f},{os.getloadavg()[0]:.1f} latency_ms={latency * 1000:g}"
    finally:
        await admin.execute(
            f"DROP SCHEMA IF EXISTS {quote_ident(run.schema)} CASCADE", timeout=ANSWER_S
        )
        await admin.close()
        await _delete_queues(settings, run.queue)


async def _send(
    run: Run,
    stack: contextlib.AsyncExitStack,
    admin: asyncpg.Connection,
    devices: int,
    workers: int,
    join_after: float,
) -> str:
    table = f"{quote_ident(run.schema)}.send_ledger"
    platform = str(run.platform)
    tokens = [f"bench-{n:07d}-{platform}" for n in range(devices)]
    body = push_job_body(targets=[Target(platform=run.platform, token=tokens[0])], title="Sale")
    body["targets"] = [{"platform": platform, "token": token} for token in tokens]
    publisher, connection = await within(
        ANSWER_S, "a publisher's connection", Publisher.connect(run.settings.amqp.urls[0])
    )
    try:
        started = time.monotonic()
        parts = await publish_push_job(publisher, run.queue, body, message_id="fanout-1")
    finally:
        await connection.close()
    if join_after > 0:
        await asyncio.sleep(max(0.0, started + join_after - time.monotonic()))
        for _ in range(workers - 1):
            await run.start_worker(stack)
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
    by_worker = run.received()
    received = [at for one in by_worker for _, at in one]
    posts = Counter(token for one in by_worker for token, _ in one)
    first, last = min(received) - started, max(received) - started
    twice = sum(n > 1 for n in posts.values())
    if len(posts) != devices:
        raise SystemExit(f"fanout: {len(posts)} devices got a request, not {devices}")
    peaks = ",".join(f"{_peak_mb(w.pid):.0f}" for w in run.workers)
    sent = ",".join(str(len(one)) for one in by_worker)
    return (
        f"fanout_bench: platform={platform} devices={devices} workers={workers}"
        f" join_after_s={join_after:g} parts={parts} first_device_s={first:.1f}"
        f" last_device_s={last:.1f} devices_per_s={devices / last:.0f}"
        f" sent_by_worker={sent} worker_peak_rss_mb={peaks} sent_twice={twice}"
    )


async def _wait_consuming(url: str, queue: str, workers: int) -> None:
    """Until `workers` consumers are on the send's bulk lane."""
    connection = await aio_pika.connect(url, timeout=ANSWER_S)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                declared = await (
                    await within(ANSWER_S, "a channel", connection.channel())
                ).declare_queue(f"{queue}.bulk", passive=True, timeout=ANSWER_S)
                if (declared.declaration_result.consumer_count or 0) >= workers:
                    return
            except aio_pika.exceptions.ChannelClosed:
                pass  # not declared yet
            if time.monotonic() > deadline:
                raise SystemExit("fanout: the workers did not consume within 60 s")
            await asyncio.sleep(0.2)
    finally:
        await connection.close()


def _peak_mb(pid: int) -> float:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except FileNotFoundError:
        return 0.0
    for line in lines:
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


async def main_async(args: argparse.Namespace) -> None:
    settings = Settings.from_env()
    with tempfile.TemporaryDirectory() as tmp:
        for platform in args.platform:
            for latency in args.latency_ms:
                for n in args.devices:
                    took: dict[int, float] = {}
                    for workers in args.workers:
                        profile = Path(tmp) / "profile.txt" if args.profile else None
                        line = await one_run(
                            settings,
                            Platform(platform),
                            n,
                            latency / 1000,
                            workers,
                            args.join_after,
                            Path(tmp),
                            profile,
                        )
                        print(line, flush=True)
                        if profile is not None:
                            print(top([profile], entries=args.profile), flush=True)
                        took[workers] = float(line.split("last_device_s=")[1].split()[0])
                    if len(took) > 1 and min(took) in took:
                        one = took[min(took)]
                        ratios = " ".join(
                            f"{w}:{t / one:.2f}" for w, t in sorted(took.items()) if w != min(took)
                        )
                        print(
                            f"fanout_scaling: platform={platform} devices={n}"
                            f" latency_ms={latency:g} join_after_s={args.join_after:g}"
                            f" time_vs_{min(took)}_worker={ratios}",
                            flush=True,
                        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.fanout")
    parser.add_argument("--devices", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[20.0, 100.0])
    parser.add_argument("--platform", nargs="+", choices=["android", "ios"], default=["android"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1])
    parser.add_argument(
        "--join-after",
        type=float,
        default=0.0,
        help="start the workers after the first this many seconds after the publish",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="sample the first worker with py-spy; print its N largest shares",
    )
    args = parser.parse_args(argv)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
