"""Case 1 of issue 9 at the providers: no request starts too late to be answered before
the caller's deadline (its ledger lease), whatever queue it waited in."""

from __future__ import annotations

import asyncio
import time

from providers import (
    ApnsProvider,
    FcmProvider,
    Notification,
    NotStartedInTime,
    Platform,
    Provider,
    ProviderReceipt,
    Push,
    Target,
    send_ids,
)
from providers.fakes.apns import ApnsReply, FakeApns
from providers.fakes.fcm import FakeFcm, FcmReply

SENDS = 20
LATENCY = 0.3
TIMEOUT = 1.0
DEADLINE_IN = 2.5  # time for ~2 rounds of the queue: the rest must not start


def push_to(token: str, platform: Platform) -> Push:
    return Push(target=Target(platform=platform, token=token), notification=Notification(body="x"))


async def send_all(
    provider: Provider, platform: Platform, deadline: float
) -> list[tuple[str, ProviderReceipt | BaseException, float]]:
    async def one(n: int) -> tuple[str, ProviderReceipt | BaseException, float]:
        token = f"device-{n:03d}"
        try:
            answer: ProviderReceipt | BaseException = await provider.send(
                push_to(token, platform), send_ids("job", token), deadline=deadline
            )
        except Exception as exc:
            answer = exc
        return token, answer, time.monotonic()

    return await asyncio.gather(*(one(n) for n in range(SENDS)))


def check(
    results: list[tuple[str, ProviderReceipt | BaseException, float]],
    deadline: float,
    requested: set[str],
) -> None:
    late = [token for token, answer, _ in results if isinstance(answer, NotStartedInTime)]
    sent = [(token, at) for token, answer, at in results if isinstance(answer, ProviderReceipt)]
    assert late, "the queue was long enough that some sends could not start in time"
    assert len(late) + len(sent) == SENDS, results
    assert requested == {token for token, _ in sent}  # a late send made no request
    assert all(at <= deadline for _, at in sent)  # every answer came before the deadline


async def test_fcm_send_that_cannot_start_before_its_deadline_is_not_made() -> None:
    async with FakeFcm() as fake:
        fake.unscripted = FcmReply(latency=LATENCY)
        provider = FcmProvider(
            fake.settings(timeout_seconds=TIMEOUT, connect_timeout_seconds=0.5, max_connections=2)
        )
        try:
            deadline = time.monotonic() + DEADLINE_IN
            results = await send_all(provider, Platform.ANDROID, deadline)
        finally:
            await provider.aclose()
        check(results, deadline, {r.token for r in fake.requests})


async def test_apns_send_that_cannot_start_before_its_deadline_is_not_made() -> None:
    async with FakeApns(max_concurrent_streams=2, unscripted=ApnsReply(latency=LATENCY)) as fake:
        provider = ApnsProvider(fake.settings(timeout_seconds=TIMEOUT, max_connections=1))
        try:
            deadline = time.monotonic() + DEADLINE_IN - 0.5
            results = await send_all(provider, Platform.IOS, deadline)
        finally:
            await provider.aclose()
        check(results, deadline, {r.token for r in fake.requests})
