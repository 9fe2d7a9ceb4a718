"""Web Push sends per second: a bare pywebpush sender beside WebPushProvider, same concurrency.

    python -m proving.bench.webpush_baseline [--sends 2000] [--concurrency 100] [--runs 3]

The baseline the push bench's web ratio is taken against (issue 57): what an
application gets from pywebpush alone, as its documentation shows it,
`webpush_async(...)` with one shared aiohttp session (a JWT signed and the
payload encrypted per send, no ledger, nothing recorded), `concurrency` sends
at a time. Beside it, `WebPushProvider` alone (one JWT per origin, httpx) at the
same concurrency, so the two figures share the machine's weather.

The fake push service runs in a child process (its CPU is not the sender's),
answers every request after 20 ms, and checks nothing (`FakeWebPush(checks=False)`):
its JWT verification and decryption would cost it more than the senders spend,
and it would set the pace. Each run sends to SUBSCRIPTIONS subscriptions in turn;
each counts its requests, which must equal `sends`. The last line:
`webpush_baseline: bare=... provider_only=... provider/bare=...` (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import ssl
import statistics
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
from py_vapid import Vapid
from pywebpush import webpush_async

from providers.fakes.webpush import FakeWebPush, WebPushReply
from providers.ids import send_ids
from providers.push import Notification, Push, Target
from providers.webpush import WebPushProvider

LATENCY = 0.020
SUBSCRIPTIONS = 100
STARTUP_S = 60.0
DATA = '{"title":"Your order shipped","body":"It arrives Friday","tag":"bench"}'


@dataclass(frozen=True, slots=True, kw_only=True)
class Served:
    """What the child's fake tells the sender: whom to send to, and how to trust it."""

    targets: list[Target]
    vapid_private_key: str
    subject: str
    ca_file: str


class FakeProcess:
    """`FakeWebPush(checks=False)` in a child process, answering after LATENCY."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, theirs = context.Pipe()
        self._child = context.Process(target=_serve, args=(theirs,), daemon=True)
        self._child.start()
        theirs.close()  # its death is then EOFError here, not a wait forever
        if not self._pipe.poll(STARTUP_S):
            self._child.kill()
            raise RuntimeError(f"the fake push service did not start within {STARTUP_S:.0f} s")
        self.served: Served = self._pipe.recv()

    def requests(self) -> int:
        """Requests read since the last call (then forgotten)."""
        self._pipe.send("count")
        count: int = self._pipe.recv()
        return count

    def __enter__(self) -> FakeProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pipe.send("stop")
        self._child.join(timeout=10)


def _serve(pipe: Connection) -> None:
    asyncio.run(_serve_until_told(pipe))


async def _serve_until_told(pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    async with FakeWebPush(unscripted=WebPushReply(latency=LATENCY), checks=False) as fake:
        targets = [fake.subscribe(f"s{n}").target for n in range(SUBSCRIPTIONS)]
        pipe.send(
            Served(
                targets=targets,
                vapid_private_key=fake.vapid_private_key,
                subject=fake.subject,
                ca_file=str(fake.ca_file),
            )
        )
        while await loop.run_in_executor(None, pipe.recv) != "stop":  # "count"
            pipe.send(len(fake.requests))
            fake.requests.clear()


async def bare_run(served: Served, sends: int, concurrency: int) -> float:
    """Sends per second through `pywebpush.webpush_async`, `concurrency` at a time."""
    vapid = Vapid.from_pem(served.vapid_private_key.encode())
    context = ssl.create_default_context(cafile=served.ca_file)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    jobs = iter(range(sends))

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in jobs:
            target = served.targets[i % len(served.targets)]
            assert target.keys is not None
            subscription: dict[str, Any] = {
                "endpoint": target.token,
                "keys": {"p256dh": target.keys.p256dh, "auth": target.keys.auth},
            }
            response = await webpush_async(
                subscription,
                DATA,
                vapid_private_key=vapid,
                vapid_claims={"sub": served.subject},
                ttl=3600,
                headers={"Topic": f"bench{i % 1000}"},
                aiohttp_session=session,
            )
            assert not isinstance(response, str)
            response.release()

    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return sends / (time.perf_counter() - started)


async def provider_run(served: Served, sends: int, concurrency: int) -> float:
    """Sends per second through `WebPushProvider` alone, `concurrency` at a time."""
    provider = WebPushProvider(
        FakeWebPush.sender_settings(
            vapid_private_key=served.vapid_private_key,
            subject=served.subject,
            ca_file=served.ca_file,
            max_connections=concurrency,
        )
    )
    note = Notification(title="Your order shipped", body="It arrives Friday")
    jobs = iter(range(sends))

    async def worker() -> None:
        for i in jobs:
            target = served.targets[i % len(served.targets)]
            await provider.send(
                Push(target=target, notification=note, ttl_seconds=3600),
                send_ids(f"bench-{i}", target.token),
            )

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await provider.aclose()
    return sends / elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m proving.bench.webpush_baseline", description=__doc__
    )
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    bare: list[float] = []
    ours: list[float] = []
    with FakeProcess() as fake:
        for round_ in range(args.runs):
            bare.append(asyncio.run(bare_run(fake.served, args.sends, args.concurrency)))
            bare_requests = fake.requests()
            ours.append(asyncio.run(provider_run(fake.served, args.sends, args.concurrency)))
            our_requests = fake.requests()
            if (bare_requests, our_requests) != (args.sends, args.sends):
                raise SystemExit(
                    f"round {round_ + 1}: the fake read {bare_requests} and {our_requests}"
                    f" requests, not {args.sends} each"
                )
            print(
                f"round {round_ + 1}: bare {bare[-1]:,.0f} sends/s,"
                f" provider_only {ours[-1]:,.0f} sends/s",
                flush=True,
            )
    b, o = statistics.median(bare), statistics.median(ours)
    print(
        f"{args.sends:,} sends to {SUBSCRIPTIONS} subscriptions, concurrency {args.concurrency},"
        f" fake push service answering after {LATENCY * 1000:.0f} ms; medians of {args.runs}"
    )
    print(f"webpush_baseline: bare={b:.0f} provider_only={o:.0f} provider/bare={o / b:.2f}")


if __name__ == "__main__":
    main()
