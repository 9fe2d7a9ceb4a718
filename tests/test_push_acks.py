"""The push runner's acks: multiple=True only over settled deliveries, against a real broker.

Jobs of one channel settle out of delivery order. A multiple ack must cover
only settled tags, must name a tag the broker still holds (or it closes the
channel), and must not wait behind a slow job longer than the hold.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aio_pika
import pytest

from consumers import Publisher, Settings, Worker, push_job_body
from consumers.pipeline.acks import AckWindow
from consumers.pipeline.deliveries import Delivery, Item
from dedupe import DbConnection
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from tests.conftest import AMQP_URL
from tests.providers.pushes import apns_push_app, requested, sent
from tests.support import close_broker_connections, no_message_ready, wait_for

MESSAGES = 6
LONG_HOLD = 60.0  # nothing goes out alone during a test that does not wait for it


@dataclass
class Consuming:
    """A fresh queue with MESSAGES published, consumed unacked on one channel."""

    connection: aio_pika.abc.AbstractConnection
    channel: aio_pika.abc.AbstractChannel
    queue: str
    window: AckWindow
    items: list[Item]  # by delivery tag: items[0] has tag 1

    async def unacked_after_close(self) -> int:
        """Close the consuming channel; what the broker got back is what was never acked."""
        await self.channel.close()
        check = await self.connection.channel()
        declared = await check.declare_queue(self.queue, passive=True)
        await check.queue_delete(self.queue)
        count = declared.declaration_result.message_count
        assert count is not None
        return count


async def consuming(hold_seconds: float) -> AsyncIterator[Consuming]:
    connection = await aio_pika.connect(AMQP_URL)
    try:
        setup = await connection.channel()
        queue = f"test-acks-{uuid.uuid4().hex[:8]}"
        await setup.declare_queue(queue, auto_delete=False)
        for n in range(MESSAGES):
            await setup.default_exchange.publish(
                aio_pika.Message(b"{}", message_id=f"m{n}"), routing_key=queue
            )
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=MESSAGES)
        window = AckWindow(hold_seconds=hold_seconds)
        got: list[Delivery] = []

        async def on_message(message: Delivery) -> None:
            window.delivered(message)
            got.append(message)

        declared = await channel.declare_queue(queue, passive=True)
        await declared.consume(on_message)

        async def all_delivered() -> bool:
            return len(got) == MESSAGES

        await wait_for(all_delivered)
        items = [Item(delivery=d, envelope=None) for d in sorted(got, key=_tag)]
        assert [_tag(d.delivery) for d in items] == list(range(1, MESSAGES + 1))
        yield Consuming(connection, channel, queue, window, items)
    finally:
        window.close()
        await connection.close()


@pytest.fixture
async def held_long() -> AsyncIterator[Consuming]:
    async for consumed in consuming(LONG_HOLD):
        yield consumed


@pytest.fixture
async def held_briefly() -> AsyncIterator[Consuming]:
    async for consumed in consuming(0.2):
        yield consumed


def _tag(delivery: Delivery) -> int:
    return delivery.delivery_tag or 0


async def test_settled_out_of_order_are_not_acked_past_an_unsettled_delivery(
    held_long: Consuming,
) -> None:
    items, window = held_long.items, held_long.window
    assert await window.settle([items[1], items[2]]) == 0  # tags 2, 3: tag 1 still in flight
    assert window.held() == 2
    assert await held_long.unacked_after_close() == MESSAGES  # nothing was acked


async def test_multiple_ack_covers_exactly_the_settled_tags_below_the_lowest_unsettled(
    held_long: Consuming,
) -> None:
    items, window = held_long.items, held_long.window
    await window.settle([items[1], items[2]])
    await window.settle([items[0]])  # tag 1 settles: one ack, multiple=True, up to 3
    await window.settle([items[4]])  # tag 5: held behind tag 4
    assert window.held() == 1
    assert window.unsettled() == 2  # tags 4 and 6
    assert await held_long.unacked_after_close() == 3  # 4, 5 and 6 come back


async def test_a_nacked_delivery_below_is_passed_and_the_channel_stays_open(
    held_long: Consuming,
) -> None:
    items, window = held_long.items, held_long.window
    await window.settle([items[0]])  # acked: tag 1 is gone at the broker
    await items[1].delivery.nack(requeue=False)  # tag 2 gone too (no dead-letter exchange)
    await window.settle([items[2]], nacked=[items[1]])  # multiple up to 3: 2 is no longer there
    await window.settle([items[3]])  # tag 4 alone above the floor: still a multiple ack
    assert window.held() == 0
    assert not held_long.channel.is_closed  # no ack named a tag the broker did not hold
    assert await held_long.unacked_after_close() == 2  # 5 and 6


async def test_acks_held_behind_a_slow_delivery_go_alone_after_the_hold(
    held_briefly: Consuming,
) -> None:
    items, window = held_briefly.items, held_briefly.window
    await window.settle([items[2], items[3]])  # tag 1 (and 2) never settle: a slow device

    async def sent_alone() -> bool:
        return window.held() == 0

    await wait_for(sent_alone, timeout=5)
    await window.settle([items[1]])  # tag 2 now: the floor is still tag 1, so it waits too
    await wait_for(sent_alone, timeout=5)
    await window.settle([items[0], items[4]])  # 1 and 5: one multiple ack at 5 covers both
    await wait_for(sent_alone, timeout=5)
    assert not held_briefly.channel.is_closed
    assert await held_briefly.unacked_after_close() == 1  # only 6, never settled


async def test_a_flush_racing_a_settle_never_acks_a_tag_a_multiple_ack_covered(
    held_long: Consuming,
) -> None:
    items, window = held_long.items, held_long.window
    await window.settle([items[2], items[3]])  # 3 and 4 held behind 1 and 2
    # The flush acks 3 and 4 alone while 1, 2 and 5 settle: were 4 still due
    # when a multiple ack at 5 went out, its own ack would name a tag the
    # broker no longer holds, and the broker would close the channel.
    await asyncio.gather(window.flush(), window.settle([items[0], items[1], items[4]]))

    async def settled() -> bool:
        return window.held() == 0

    await wait_for(settled, timeout=5)
    assert await _nothing_ready_on(held_long) is None  # the channel is still open
    assert await held_long.unacked_after_close() == 1  # 6 only


async def _nothing_ready_on(consumed: Consuming) -> str | None:
    """A round trip on the consuming channel: None, or why the broker closed it."""
    try:
        await consumed.channel.declare_queue(consumed.queue, passive=True)
    except Exception as exc:
        return repr(exc)
    return None


@pytest.mark.skipif(
    shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to close a connection"
)
async def test_push_acks_after_a_reconnect_leave_nothing_unacked_and_send_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    fake_apns: FakeApns,
) -> None:
    """Tags start again at 1 on the new channel: the old channel's window must not ack them."""
    fake_apns.script("slow-device-xxxxxxxx", latency=1.0)  # in flight when the channel goes
    app = apns_push_app(queue_name, fake_apns, timeout=5.0)
    tokens = ["slow-device-xxxxxxxx", *(f"fast-device-{n:04d}" for n in range(20))]
    async with Worker(app, settings) as worker:
        for n, token in enumerate(tokens[:11]):
            body = push_job_body(targets=[Target(platform=Platform.IOS, token=token)], body="x")
            await publisher.publish(queue_name, body, message_id=f"before-{n}")
        await wait_for(lambda: requested(fake_apns, 11))
        closed = await asyncio.to_thread(
            close_broker_connections, f"idempotent-workers {worker.worker_id}"
        )
        assert closed == 1
        for n, token in enumerate(tokens[11:]):
            body = push_job_body(targets=[Target(platform=Platform.IOS, token=token)], body="x")
            await publisher.publish(queue_name, body, message_id=f"after-{n}")
        await wait_for(lambda: sent(db, len(tokens)), timeout=60)
        await wait_for(lambda: no_message_ready(AMQP_URL, queue_name), timeout=30)
        loops = worker._loops
        assert all(loop.queue is not None and not loop.queue.channel.is_closed for loop in loops)

        async def all_acked() -> bool:
            return all(loop.acks is None or loop.acks.unsettled() == 0 for loop in loops)

        await wait_for(all_acked, timeout=30)
    assert await no_message_ready(AMQP_URL, queue_name)  # after stop: nothing came back unacked
    assert all(len(fake_apns.requests_for(t)) == 1 for t in tokens)
