"""Sends past a connection's flow-control window wait for credit in line, each woken once.

An APNs connection's window (65,535 bytes until the server raises it) holds a few
dozen large bodies; the rest wait for WINDOW_UPDATE. One event set for every
waiter on every update woke all of them to find no room and wait again: work
that grew with the square of the sends waiting (a fan-out of thousands).
"""

from __future__ import annotations

import asyncio

import pytest

from providers import ApnsProvider, Notification, PermanentProviderError, Platform, Push, Target
from providers.apns import _ExactlyOnceProtocol
from providers.apns_wire import apns_body
from providers.fakes.apns import FakeApns
from tests.providers.pushes import ids_for

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

    assert [r.provider_message_id for r in receipts] == [ids_for(t).apns_id for t in tokens]
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
    assert [r.provider_message_id for r in receipts] == [ids_for(t).apns_id for t in tokens]
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
