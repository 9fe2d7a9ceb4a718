"""Each aioapns trap that could send a push twice or hang, closed: counted at the fake.

The rule checked everywhere: exactly one request reaches APNs per attempt, and a
request whose outcome is unknown raises UnknownOutcomeError and is never resent.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from providers import (
    ApnsProvider,
    InvalidDeviceToken,
    ProviderError,
    ProviderReceipt,
    TransientProviderError,
    UnknownOutcomeError,
)
from providers.apns import _ExactlyOnceProtocol
from providers.apns_wire import AnswerWaits, Lost, PendingStream
from providers.fakes.apns import FakeApns
from tests.providers.pushes import ids_for, push_to, send_or_error
from tests.support import wait_for


async def test_a_dropped_connection_fails_in_flight_requests_without_resending(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    neighbours = [f"neighbour-{i}" for i in range(5)]
    for token in neighbours:
        fake_apns.script(token, latency=1.0)
    fake_apns.script("dropper", latency=0.2, drop=True)

    results = await asyncio.gather(
        *(send_or_error(apns, push_to(t)) for t in [*neighbours, "dropper"])
    )

    assert all(isinstance(r, UnknownOutcomeError) for r in results)
    await asyncio.sleep(0.5)  # time enough for any resend to arrive
    assert Counter(r.token for r in fake_apns.requests) == dict.fromkeys(
        [*neighbours, "dropper"], 1
    )
    assert fake_apns.connections_opened == 1


async def test_b_cancelled_send_neither_hangs_nor_resends_its_neighbours(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    neighbours = [f"neighbour-{i}" for i in range(5)]
    for token in [*neighbours, "cancelled"]:
        fake_apns.script(token, latency=0.4)
    victim = asyncio.create_task(send_or_error(apns, push_to("cancelled")))
    others = asyncio.gather(*(send_or_error(apns, push_to(t)) for t in neighbours))
    await wait_for(lambda: _received(fake_apns, 6), timeout=10)  # all on the wire
    victim.cancel()

    results = await others
    with pytest.raises(asyncio.CancelledError):
        await victim
    assert all(isinstance(r, ProviderReceipt) for r in results)
    await asyncio.sleep(0.5)
    assert len(fake_apns.requests) == 6
    assert await send_or_error(apns, push_to("after")) == ProviderReceipt(
        provider="apns", provider_message_id=ids_for("after").effect_id
    )
    assert {r.connection_id for r in fake_apns.requests} == {1}


async def test_b_cancelled_send_leaves_its_stream_to_its_answer(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    """Cancelling a send ends its wait, not its stream: the stream stays on its
    connection, its answer pending (what `aclose` waits for), until APNs answers."""
    fake_apns.script("cancelled", latency=0.5)
    victim = asyncio.create_task(apns.send(push_to("cancelled"), ids_for("cancelled")))
    await wait_for(lambda: _received(fake_apns, 1), timeout=10)
    victim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await victim

    assert apns._pool is not None
    [connection] = [c for c in apns._pool.connections if isinstance(c, _ExactlyOnceProtocol)]
    [stream] = connection.streams.values()
    assert not stream.answer.done()

    async def answered() -> bool:
        return not connection.streams

    await wait_for(answered, timeout=10)
    assert stream.answer.done() and not stream.answer.cancelled()
    assert len(fake_apns.requests) == 1


async def test_b_timed_out_send_abandons_its_connection_but_not_its_neighbours(
    fake_apns: FakeApns,
) -> None:
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=0.5, max_connections=1))
    neighbours = [f"neighbour-{i}" for i in range(5)]
    for token in neighbours:
        fake_apns.script(token, latency=0.3)
    fake_apns.script("stuck", latency=2.0)
    try:
        results = await asyncio.gather(
            *(send_or_error(provider, push_to(t)) for t in ["stuck", *neighbours])
        )
        assert isinstance(results[0], UnknownOutcomeError)
        assert all(isinstance(r, ProviderReceipt) for r in results[1:])
        assert isinstance(await send_or_error(provider, push_to("fresh")), ProviderReceipt)
    finally:
        await provider.aclose()
    assert len(fake_apns.requests) == 7
    assert fake_apns.requests_for("fresh")[0].connection_id == 2


async def test_c_3000_error_replies_on_one_connection_neither_stall_nor_duplicate(
    fake_apns: FakeApns,
) -> None:
    # a generous timeout: this checks for a stall, not for speed on a busy CI box
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=10.0, max_connections=1))
    fake_apns.script("bad", status=400, reason="BadDeviceToken")
    limit = asyncio.Semaphore(100)

    async def one(i: int) -> ProviderError | ProviderReceipt:
        async with limit:
            try:
                return await provider.send(push_to("bad"), ids_for("bad", job=f"job-{i}"))
            except ProviderError as exc:
                return exc

    try:
        results = await asyncio.gather(*(one(i) for i in range(3000)))
    finally:
        await provider.aclose()

    assert Counter(repr(r) for r in results) == {repr(results[0]): 3000}
    assert isinstance(results[0], InvalidDeviceToken)
    assert len(fake_apns.requests) == 3000
    assert len({r.apns_id for r in fake_apns.requests}) == 3000
    assert {r.connection_id for r in fake_apns.requests} == {1}


async def test_c_an_error_body_split_across_data_frames_is_read_whole(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    long_reason = "Unregistered" + "x" * 100_000  # > one frame, > the initial window
    fake_apns.script("device-1", status=410, reason=long_reason)

    with pytest.raises(InvalidDeviceToken) as raised:
        await apns.send(push_to("device-1"), ids_for("device-1"))

    assert raised.value.reason == long_reason
    assert isinstance(await send_or_error(apns, push_to("device-2")), ProviderReceipt)
    assert len(fake_apns.requests) == 2


async def test_d_aclose_fails_in_flight_requests_without_resending(fake_apns: FakeApns) -> None:
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=0.3, max_connections=1))
    tokens = [f"slow-{i}" for i in range(5)]
    for token in tokens:
        fake_apns.script(token, latency=3.0)
    sends = asyncio.gather(*(send_or_error(provider, push_to(t)) for t in tokens))
    await wait_for(lambda: _received(fake_apns, 5), timeout=10)  # all on the wire

    await provider.aclose()

    assert all(isinstance(r, UnknownOutcomeError) for r in await sends)
    await asyncio.sleep(0.5)
    assert len(fake_apns.requests) == 5
    assert fake_apns.connections_opened == 1


async def test_d_aclose_lets_in_flight_requests_finish(fake_apns: FakeApns) -> None:
    provider = ApnsProvider(fake_apns.settings(timeout_seconds=2.0))
    fake_apns.script("quick", latency=0.2)
    send = asyncio.create_task(send_or_error(provider, push_to("quick")))
    await wait_for(lambda: _received(fake_apns, 1), timeout=10)  # on the wire

    await provider.aclose()

    assert isinstance(await send, ProviderReceipt)
    assert len(fake_apns.requests) == 1


async def test_e_two_concurrent_sends_with_one_apns_id_each_get_their_own_answer(
    apns: ApnsProvider, fake_apns: FakeApns
) -> None:
    fake_apns.script("kept", latency=0.3)
    fake_apns.script("gone", status=410, latency=0.1)
    shared = ids_for("kept")

    kept, gone = await asyncio.gather(
        apns.send(push_to("kept"), shared),
        apns.send(push_to("gone"), shared),
        return_exceptions=True,
    )

    assert kept == ProviderReceipt(provider="apns", provider_message_id=shared.effect_id)
    assert isinstance(gone, InvalidDeviceToken)
    assert [r.apns_id for r in fake_apns.requests] == [shared.effect_id] * 2
    assert {r.connection_id for r in fake_apns.requests} == {1}


async def _received(fake: FakeApns, n: int) -> bool:
    return len(fake.requests) >= n


async def test_f_no_stream_opens_before_the_servers_settings_give_its_limit() -> None:
    # A server one round trip away: its SETTINGS (limit 50) arrive 0.2 s after TLS is up.
    # A stream past the limit is a connection error there, so a burst sent before the
    # SETTINGS would end the connection and leave every request on it unknown.
    async with FakeApns(max_concurrent_streams=50, settings_delay=0.2) as fake:
        provider = ApnsProvider(fake.settings())
        tokens = [f"burst-{i}" for i in range(300)]
        try:
            results = await asyncio.gather(*(send_or_error(provider, push_to(t)) for t in tokens))
        finally:
            await provider.aclose()
        assert fake.protocol_errors == []
        assert [r for r in results if not isinstance(r, ProviderReceipt)] == []
        assert Counter(r.token for r in fake.requests) == dict.fromkeys(tokens, 1)


async def test_f_a_connection_whose_settings_never_come_is_closed_and_replaced() -> None:
    # SETTINGS 1.5 s late against a 0.5 s timeout: the first send waits its timeout
    # and fails unsent; the connection is closed by then, so the next send gets a
    # new one instead of waiting on the same silent connection forever.
    async with FakeApns(settings_delay=1.5) as fake:
        provider = ApnsProvider(fake.settings(timeout_seconds=0.5, max_connections=1))
        try:
            first = await send_or_error(provider, push_to("late-settings-1"))
            fake.settings_delay = 0.0
            second = await send_or_error(provider, push_to("late-settings-2"))
        finally:
            await provider.aclose()
        assert isinstance(first, TransientProviderError), first
        assert second == ProviderReceipt(
            provider="apns", provider_message_id=ids_for("late-settings-2").effect_id
        )
        assert [r.token for r in fake.requests] == ["late-settings-2"]
        assert fake.connections_opened == 2


async def test_answer_waits_end_at_the_answer_or_the_deadline_and_never_cancel_it() -> None:
    loop = asyncio.get_running_loop()
    streams: dict[int, PendingStream] = {}
    waits = AnswerWaits(loop, lambda: streams.values())

    def pending(stream_id: int, seconds: float) -> PendingStream:
        stream = PendingStream(answer=loop.create_future(), deadline=loop.time() + seconds)
        streams[stream_id] = stream
        return stream

    def finish(stream_id: int) -> None:  # what the connection does with an answer
        stream = streams.pop(stream_id)
        stream.answer.set_result(Lost(reason="test"))
        waits.answered(stream)

    answered = pending(1, 10.0)
    loop.call_soon(finish, 1)
    assert await waits.wait(answered)

    long, short = pending(3, 10.0), pending(5, 0.05)
    waiting_long = asyncio.create_task(waits.wait(long))
    await asyncio.sleep(0)  # the timer is at the long deadline now
    started = loop.time()
    assert not await asyncio.wait_for(waits.wait(short), 5.0)  # its own deadline, not 10 s
    assert loop.time() - started < 5.0
    assert not short.answer.done()

    waiting_long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting_long
    assert not long.answer.done()  # neither the deadline nor the cancel touched it
    finish(3)  # a late answer is still taken
    assert long.answer.done()
    waits.close()
