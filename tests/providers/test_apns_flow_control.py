"""Sends past a connection's flow-control window wait for credit in line, each woken once.

An APNs connection's window (65,535 bytes until the server raises it) holds a few
dozen large bodies; the rest wait for WINDOW_UPDATE. One event set for every
waiter on every update woke all of them to find no room and wait again: work
that grew with the square of the sends waiting (a fan-out of thousands).
"""

from __future__ import annotations

import asyncio

import pytest

from providers import (
    ApnsProvider,
    Notification,
    PermanentProviderError,
    Platform,
    ProviderReceipt,
    Push,
    Target,
)
from providers.apns import _ExactlyOnceProtocol
from providers.apns_wire import apns_body
from providers.fakes.apns import FakeApns
from tests.providers.pushes import ids_for, push_to

SENDS = 600
PAD = "x" * 2_000  # a body of about 2 KB: some 30 fill the window


def large_push(token: str) -> Push:
    note = Notification(title="Your order shipped", body="It arrives Friday", data={"pad": PAD})
    return Push(target=Target(platform=Platform.IOS, token=token), notification=note)


async def test_a_window_update_wakes_only_the_sends_it_has_room_for(
    fake_apns: FakeApns, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits = 0
    credit = _ExactlyOnceProtocol.credit

    async def counted(self: _ExactlyOnceProtocol, size: int) -> None:
        nonlocal waits
        waits += 1
        await credit(self, size)

    monkeypatch.setattr(_ExactlyOnceProtocol, "credit", counted)
    # A timeout no wait in line comes near: the sends wait for credit, not for time.
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=30.0, max_connections=1))
    try:
        await provider.send(large_push("first"), ids_for("first"))  # the connection is up
        tokens = [f"device-{n}" for n in range(SENDS)]
        receipts = await asyncio.gather(*(provider.send(large_push(t), ids_for(t)) for t in tokens))
    finally:
        await provider.aclose()

    assert [r.provider_message_id for r in receipts] == [ids_for(t).effect_id for t in tokens]
    assert sorted(r.token for r in fake_apns.requests) == sorted([*tokens, "first"])
    assert waits > 0, "no send waited for credit: the test proved nothing"
    # In line, a send waits about once (twice when a send that did not wait took
    # the credit first); woken all at once, each waited once per update.
    assert waits <= 2 * SENDS, f"{waits} waits for credit by {SENDS} sends"


async def test_a_body_apns_refuses_fails_at_once_and_holds_no_send_behind_it(
    fake_apns: FakeApns,
) -> None:
    """A body past the connection's window can never be sent: it used to wait for
    credit at the head of the line until its timeout, and every send that needed
    credit waited behind it. APNs takes at most 4,096 bytes (413 PayloadTooLarge)."""
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=30.0, max_connections=1))
    try:
        await provider.send(large_push("first"), ids_for("first"))  # the connection is up
        huge = Push(
            target=Target(platform=Platform.IOS, token="huge"),
            notification=Notification(title="t", body="b", data={"pad": "x" * 100_000}),
        )
        refused = asyncio.ensure_future(provider.send(huge, ids_for("huge")))
        tokens = [f"device-{n}" for n in range(100)]  # 200 KB: some wait for credit
        async with asyncio.timeout(10):  # the sends' own timeout is 30 s
            receipts = await asyncio.gather(
                *(provider.send(large_push(t), ids_for(t)) for t in tokens)
            )
            with pytest.raises(PermanentProviderError) as caught:
                await refused
    finally:
        refused.cancel()
        await provider.aclose()
    assert caught.value.reason == "PayloadTooLarge"
    assert [r.provider_message_id for r in receipts] == [ids_for(t).effect_id for t in tokens]
    assert "huge" not in {r.token for r in fake_apns.requests}  # never written


@pytest.mark.parametrize(("push_type", "limit"), [("alert", 4096), ("voip", 5120)])
async def test_apns_payload_limits_are_apples(
    apns: ApnsProvider, fake_apns: FakeApns, push_type: str, limit: int
) -> None:
    """A body of exactly the limit goes; one byte more is refused without a request."""

    def sized(token: str, size: int) -> Push:
        note = Notification(title="t", body="b", data={"pad": ""})
        bare = len(
            apns_body(
                Push(
                    target=Target(platform=Platform.IOS, token=token),
                    notification=note,
                    push_type=push_type,
                )
            )
        )
        note = Notification(title="t", body="b", data={"pad": "x" * (size - bare)})
        push = Push(
            target=Target(platform=Platform.IOS, token=token),
            notification=note,
            push_type=push_type,
        )
        assert len(apns_body(push)) == size
        return push

    await apns.send(sized("at-limit", limit), ids_for("at-limit"))
    with pytest.raises(PermanentProviderError) as caught:
        await apns.send(sized("past-limit", limit + 1), ids_for("past-limit"))
    assert caught.value.reason == "PayloadTooLarge"
    assert [r.token for r in fake_apns.requests] == ["at-limit"]


HELD = 40  # the fake's stream limit: a connection with this many open is full
BURST = 400  # 800 KB of bodies: most wait for credit


async def test_a_send_woken_for_credit_starts_on_the_connection_whose_credit_woke_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A send waiting for credit on one connection, once woken, went back to the
    pool, which hands out the first connection with a stream free: another one.
    The room kept for it went unused, and the sends still in line were woken by
    nothing (no data in flight there, so no WINDOW_UPDATE to come) until their
    timeout. In the push bench's fan-out, 184 sends waited out their 10 s and
    failed as NoConnectionAvailable on a connection with nothing in flight."""
    # Closing a connection idle for 10 s (aioapns) woke the sends stuck on it, and so
    # hid the fault, 10 s late: out of the way, a stuck send fails on its timeout.
    monkeypatch.setattr(_ExactlyOnceProtocol, "INACTIVITY_TIME", 3600.0)
    release = asyncio.Event()
    async with FakeApns(max_concurrent_streams=HELD) as fake:
        held_tokens = [f"held-{n}" for n in range(HELD)]
        for token in held_tokens:
            fake.script(token, until=release)
        # A timeout no send comes near unless it is stuck: then it fails, and says so.
        provider = ApnsProvider(fake.settings(timeout_seconds=30.0, max_connections=2))
        held = [asyncio.ensure_future(provider.send(push_to(t), ids_for(t))) for t in held_tokens]
        burst: list[asyncio.Future[ProviderReceipt]] = []
        try:
            async with asyncio.timeout(10):  # the fake reads in microseconds
                while len(fake.requests) < HELD:  # the first connection is full
                    await asyncio.sleep(0.001)
            # The first connection is full: the pool opens a second one.
            await provider.send(push_to("second"), ids_for("second"))
            tokens = [f"device-{n}" for n in range(BURST)]
            # They go to the second connection and queue for its credit.
            burst = [
                asyncio.ensure_future(provider.send(large_push(t), ids_for(t))) for t in tokens
            ]
            async with asyncio.timeout(10):
                while len(fake.requests) < HELD + BURST // 10:
                    await asyncio.sleep(0)  # each loop turn: most of the burst still in line
            assert provider._pool is not None
            connections = provider._pool.connections
            in_line = sum(
                len(c.writers) for c in connections if isinstance(c, _ExactlyOnceProtocol)
            )
            release.set()  # the first connection empties: the pool hands it out first again
            results = await asyncio.gather(*burst, *held, return_exceptions=True)
        finally:
            release.set()
            for send in [*burst, *held]:
                send.cancel()
            await provider.aclose()

    assert fake.connections_opened == 2
    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} of {BURST + HELD} sends failed, first: {failed[0]!r}"
    assert in_line > BURST // 2, f"only {in_line} sends in line for credit: the test proved nothing"
