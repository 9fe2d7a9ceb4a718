"""The publisher loses no job without a word: each trap of its docstring, (a) to (d)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from consumers import Job, NotConfirmed, Publisher, PublisherSettings, Unroutable
from proving.chaos.proxy import FaultProxy
from tests.conftest import AMQP_URL
from tests.support import wait_for
from tests.test_chaos_proxy import _proxy_to, _through

FAST = PublisherSettings(attempts=3, base_delay_s=0.01, max_delay_s=0.05, confirm_timeout_s=5)


@pytest.fixture
async def small_queue(channel: aio_pika.abc.AbstractChannel) -> AsyncIterator[str]:
    """A queue that holds one message and nacks the publishes beyond it."""
    name = f"test.small.{uuid.uuid4().hex[:12]}"
    await channel.declare_queue(name, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    yield name
    await channel.queue_delete(name)


async def _drain(channel: aio_pika.abc.AbstractChannel, queue: str) -> list[tuple[str, bytes]]:
    got = []
    q = await channel.declare_queue(queue, passive=True)
    while (message := await q.get(no_ack=True, fail=False)) is not None:
        got.append((message.message_id or "", message.body))
    return got


async def test_publish_to_a_queue_nobody_declared_raises_unroutable(
    publisher: Publisher,
) -> None:
    # Today's main returned normally here: the broker dropped the job and confirmed it.
    queue = f"no.such.queue.{uuid.uuid4().hex}"
    with pytest.raises(Unroutable) as raised:
        await publisher.publish(queue, {"n": 1}, message_id="m1")
    assert (raised.value.queue, raised.value.message_id) == (queue, "m1")
    assert publisher.retried == 0  # a returned job is not tried again


async def test_a_nacked_publish_is_retried_up_to_the_bound_then_raised(
    small_queue: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    publisher, connection = await Publisher.connect(AMQP_URL, FAST)
    try:
        await publisher.publish(small_queue, {"n": 0}, message_id="m0")
        with pytest.raises(NotConfirmed, match="not confirmed after 3 tries"):
            await publisher.publish(small_queue, {"n": 1}, message_id="m1")
    finally:
        await connection.close()
    assert publisher.retried == 2
    assert await _drain(channel, small_queue) == [("m0", b'{"n":0}')]


async def test_a_nacked_publish_is_retried_with_the_same_message_id_and_body(
    small_queue: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    patient = PublisherSettings(attempts=50, base_delay_s=0.01, max_delay_s=0.1)
    publisher, connection = await Publisher.connect(AMQP_URL, patient)
    try:
        await publisher.publish(small_queue, {"n": 0}, message_id="m0")
        sending = asyncio.create_task(publisher.publish(small_queue, {"n": 1}, message_id="m1"))

        async def nacked() -> bool:
            return publisher.retried >= 1

        await wait_for(nacked)
        # Take m0 alone to make room for one: a drain could also read m1's retry,
        # which may land as soon as m0 is gone.
        q = await channel.declare_queue(small_queue, passive=True)
        first = await q.get(no_ack=True)
        assert (first.message_id, first.body) == ("m0", b'{"n":0}')
        await asyncio.wait_for(sending, 30)
    finally:
        await connection.close()
    assert await _drain(channel, small_queue) == [("m1", b'{"n":1}')]


async def test_many_publishes_in_flight_each_resolve_on_their_own_confirm(
    publisher: Publisher, queue_name: str, channel: aio_pika.abc.AbstractChannel
) -> None:
    await channel.declare_queue(queue_name, durable=True)
    nowhere = f"no.such.queue.{uuid.uuid4().hex}"
    # The same message_id to a real queue and to nowhere, many times over, all
    # in flight at once: each unroutable one, and only those, must raise.
    jobs = [
        Job(queue=nowhere if n % 10 == 3 else queue_name, body={"n": n}, message_id=f"m{n % 20}")
        for n in range(2_000)
    ]
    results = await publisher.publish_many(jobs)
    for job, result in zip(jobs, results, strict=True):
        if job.queue == nowhere:
            assert isinstance(result, Unroutable)
        else:
            assert result is None
    got = await _drain(channel, queue_name)
    assert len(got) == 1_800
    assert sorted(m for m, _ in got) == sorted(j.message_id for j in jobs if j.queue != nowhere)


async def test_a_connection_lost_before_the_confirm_is_published_again_on_the_new_one(
    channel: aio_pika.abc.AbstractChannel, queue_name: str
) -> None:
    await channel.declare_queue(queue_name, durable=True)
    proxy: FaultProxy = await _proxy_to(AMQP_URL, "amqp", 5672)
    connection = await aio_pika.connect_robust(_through(AMQP_URL, proxy), reconnect_interval=0.5)
    try:
        settings = PublisherSettings(
            attempts=20, base_delay_s=0.05, max_delay_s=0.5, confirm_timeout_s=1
        )
        publisher = Publisher(await connection.channel(publisher_confirms=True), settings)
        # Nothing flows for 2 s (no confirm comes: the try times out), then
        # every connection is reset; the robust connection comes back.
        holding = asyncio.create_task(proxy.hold(2))
        await asyncio.sleep(0)  # the hold is in place before the publish
        await asyncio.wait_for(publisher.publish(queue_name, {"n": 1}, message_id="m1"), 60)
        await holding
        assert publisher.retried >= 1
        got = await _drain(channel, queue_name)
        assert got and set(got) == {("m1", b'{"n":1}')}  # perhaps twice: the same job
    finally:
        await connection.close()
        await proxy.close()
