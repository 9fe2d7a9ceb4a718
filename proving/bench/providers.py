"""Sends per second through ApnsProvider and FcmProvider to local fakes answering in 20 ms.

    python -m proving.bench.providers [--sends 5000] [--concurrency 200] [--runs 3]

Each fake runs in its own process, so the figure is the provider's (one process,
one event loop), not the fake's. Every run uses a fresh provider (connections
and OAuth token included) and prints the median of the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Literal

from providers.apns import ApnsProvider, ApnsSettings
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.fcm import FakeFcm
from providers.fcm import FcmProvider, FcmSettings
from providers.ids import send_ids
from providers.provider import Provider
from providers.push import Notification, Platform, Push, Target
from proving.bench import schedstat

TOKEN = "bench-device"
LATENCY = 0.020
Service = Literal["apns", "fcm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    service: str
    sends: int
    concurrency: int
    rates: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    def line(self) -> str:
        runs = ", ".join(f"{r:,.0f}" for r in self.rates)
        return (
            f"{self.service}: {self.sends} sends, concurrency {self.concurrency}, fake answers "
            f"after {LATENCY * 1000:.0f} ms: median {self.median:,.0f} sends/s (runs: {runs})"
        )


STARTUP_S = 60.0


class FakeServer:
    """A fake APNs or FCM in a child process, so its CPU is not the measured process'.

    The fake APNs answers every token after `latency` seconds; the fake FCM, `TOKEN`.
    `requests()` asks the child how many requests it read (and with how many distinct
    apns-ids), `forget()` clears them.
    """

    def __init__(self, service: Service, *, latency: float = LATENCY) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, theirs = context.Pipe()
        self._child = context.Process(target=_serve, args=(service, latency, theirs), daemon=True)
        self._child.start()
        theirs.close()  # the child's end: its death is then EOFError here, not a wait forever
        if not self._pipe.poll(STARTUP_S):
            self._child.kill()
            raise RuntimeError(f"the fake {service} did not start within {STARTUP_S:.0f} s")
        try:
            self.settings: ApnsSettings | FcmSettings = self._pipe.recv()
        except EOFError:
            self._child.join(timeout=5)
            raise RuntimeError(
                f"the fake {service} exited before it listened (exit {self._child.exitcode})"
            ) from None

    def cpu(self) -> schedstat.CpuTimes | None:
        """The child's main thread (its event loop): time on a CPU and waiting for one."""
        pid = self._child.pid
        return None if pid is None else schedstat.of_process(pid)

    def requests(self) -> tuple[int, int]:
        """(requests read, distinct apns-ids among them) since the last `forget()`."""
        self._pipe.send("count")
        counts: tuple[int, int] = self._pipe.recv()
        return counts

    def protocol_errors(self) -> list[str]:
        """Why the fake APNs closed a connection on an HTTP/2 error, since the last `forget()`."""
        self._pipe.send("errors")
        errors: list[str] = self._pipe.recv()
        return errors

    def forget(self) -> None:
        self._pipe.send("forget")
        self._pipe.recv()

    def stop(self) -> None:
        self._pipe.send("stop")
        self._child.join(timeout=10)

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _serve(service: Service, latency: float, pipe: Connection) -> None:
    asyncio.run(_serve_until_told(service, latency, pipe))


async def _serve_until_told(service: Service, latency: float, pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        fake: FakeApns | FakeFcm
        if service == "apns":
            fake = await stack.enter_async_context(FakeApns(unscripted=ApnsReply(latency=latency)))
        else:
            fake = await stack.enter_async_context(FakeFcm())
            fake.script(TOKEN, latency=latency)
        pipe.send(fake.settings())
        while (command := await loop.run_in_executor(None, pipe.recv)) != "stop":
            if command == "count":
                ids = {r.apns_id for r in fake.requests} if isinstance(fake, FakeApns) else ()
                pipe.send((len(fake.requests), len(ids) or len(fake.requests)))
            elif command == "errors":
                pipe.send(list(fake.protocol_errors) if isinstance(fake, FakeApns) else [])
            elif command == "forget":
                fake.requests.clear()
                if isinstance(fake, FakeApns):
                    fake.protocol_errors.clear()
                pipe.send(None)


async def one_run(provider: Provider, platform: Platform, sends: int, concurrency: int) -> float:
    """Sends per second of `sends` pushes, `concurrency` at a time; closes `provider`."""
    push = Push(
        target=Target(platform=platform, token=TOKEN),
        notification=Notification(title="Your order shipped", body="It arrives Friday"),
    )
    jobs = iter(range(sends))

    async def worker() -> None:
        for i in jobs:
            await provider.send(push, send_ids(f"bench-{i}", TOKEN))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await provider.aclose()
    return sends / elapsed


async def _bench(
    service: Service, settings: ApnsSettings | FcmSettings, sends: int, concurrency: int, runs: int
) -> BenchResult:
    rates = []
    for _ in range(runs):
        provider: Provider
        if isinstance(settings, ApnsSettings):
            provider = ApnsProvider(settings)
            platform = Platform.IOS
        else:
            provider = FcmProvider(settings)
            platform = Platform.ANDROID
        rates.append(await one_run(provider, platform, sends, concurrency))
    return BenchResult(service=service, sends=sends, concurrency=concurrency, rates=rates)


def bench(service: Service, *, sends: int, concurrency: int, runs: int) -> BenchResult:
    """Run the fake in a child process, the provider here; return the measured rates."""
    with FakeServer(service) as fake:
        settings = fake.settings
        if isinstance(settings, FcmSettings):
            settings = FcmSettings(
                credentials=settings.credentials,
                project_id=settings.project_id,
                base_url=settings.base_url,
                max_connections=concurrency,
            )
        return asyncio.run(_bench(service, settings, sends, concurrency, runs))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m proving.bench.providers", description=__doc__)
    parser.add_argument("--sends", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=["apns", "fcm"], default=None)
    args = parser.parse_args()
    services: list[Service] = ["apns", "fcm"] if args.only is None else [args.only]
    for service in services:
        result = bench(service, sends=args.sends, concurrency=args.concurrency, runs=args.runs)
        print(result.line(), flush=True)


if __name__ == "__main__":
    main()
