"""The worker consumes below aio-pika's per-delivery objects, through reconnects too."""

from __future__ import annotations

import asyncio
import shutil
from collections import deque
from typing import Any, cast

import aio_pika
import aiormq
import pytest

from consumers import App, Context, Publisher, RetryPolicy, Settings, Worker
from consumers.broker.connection import connect
from consumers.broker.consume import Delivery, DirectConsumer, RawDelivery
from dedupe import DbConnection
from proving.deadlines import ANSWER_S
from tests.conftest import AMQP_URL
from tests.support import close_broker_connections, publish_confirmed, wait_for

needs_rabbitmqctl = pytest.mark.skipif(
    shutil.which("rabbitmqctl") is None, reason="needs rabbitmqctl to close a connection"
)


def _recording_app(queue: str, retry_policy: RetryPolicy, seen: list[str]) -> App:
    app = App(retry=retry_policy)

    @app.handler(queue)
    async def record(ctx: Context) -> None:
        seen.append(ctx.message_id)
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, '', 0)",
            ctx.message_id,
        )

    return app


async def _direct_consumers(worker: Worker) -> int:
    """How many of the worker's consuming channels deliver through a DirectConsumer now."""
    direct = 0
    for loop in worker._loops:
        assert loop.queue is not None
        channel = cast(aiormq.Channel, await loop.queue.channel.get_underlay_channel())
        callbacks = [getattr(c, "__self__", None) for c in channel.consumers.values()]
        direct += sum(isinstance(c, DirectConsumer) for c in callbacks)
    return direct


async def _effects(db: DbConnection, message_id: str) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM effects WHERE message_id = $1", message_id)
    return count


class _Recording(deque[tuple[Delivery, int]]):
    """A batch loop's buffer that keeps the type of every delivery appended to it."""

    def __init__(self) -> None:
        super().__init__()
        self.types: list[type] = []

    def append(self, entry: tuple[Delivery, int]) -> None:
        self.types.append(type(entry[0]))
        super().append(entry)


async def test_batch_loop_buffers_raw_deliveries_and_acks_them_after_commit(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    seen: list[str] = []
    async with Worker(_recording_app(queue_name, retry_policy, seen), settings) as worker:
        assert await _direct_consumers(worker) == 1
        (loop,) = worker._loops
        loop.buffer = recording = _Recording()
        await publisher.publish(queue_name, {"n": 1}, message_id="raw-1")

        async def committed() -> bool:
            return await _effects(db, "raw-1") == 1

        await wait_for(committed)
        assert recording.types == [RawDelivery]
    # Acked: with the worker's connection closed, nothing came back to the queue.
    declared = await channel.declare_queue(queue_name, passive=True)
    assert declared.declaration_result.message_count == 0
    assert seen == ["raw-1"]


BACKLOG = 400  # waiting before the consumer starts: deliveries arrive during basic.consume
STARTS = 5  # consumers started on it in turn, each a chance for a delivery to overtake


async def _handed_over(
    connection: aio_pika.abc.AbstractRobustConnection, queue_name: str
) -> list[tuple[asyncio.Task[object] | None, int]]:
    """Start a DirectConsumer on the backlog; each delivery's handing task and tag, unacked."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=BACKLOG)
    queue = await channel.declare_queue(queue_name, passive=True)
    handed: list[tuple[asyncio.Task[object] | None, int]] = []
    done = asyncio.Event()

    def on_delivery(delivery: Delivery) -> None:
        assert isinstance(delivery, RawDelivery)
        handed.append((asyncio.current_task(), delivery.delivery_tag or 0))
        if len(handed) == BACKLOG:
            done.set()

    await queue.consume(cast(Any, DirectConsumer(on_delivery)))
    async with asyncio.timeout(ANSWER_S):
        await done.wait()
    await channel.close()  # nothing acked: the backlog is back for the next start
    return handed


async def test_a_consumer_started_on_a_backlog_gets_each_delivery_in_tag_order_without_a_task(
    queue_name: str,
) -> None:
    """Deliveries reach `on_delivery` in the channel's tag order, in aiormq's frame reader.

    A batch acks `multiple=True` at its highest tag, so a delivery handed over
    after a higher one of its channel would be acked before it was processed
    (lost if the worker dies before its turn). The broker starts delivering a
    backlog while `basic.consume` is still being answered: every one of those
    must take the same path as the rest.
    """
    connection = await connect([AMQP_URL], name="test-direct-order")
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue_name)
        for n in range(BACKLOG):
            await publish_confirmed(channel, aio_pika.Message(str(n).encode()), queue_name)
        for start in range(STARTS):
            handed = await _handed_over(connection, queue_name)
            tags = [tag for _, tag in handed]
            assert tags == list(range(1, BACKLOG + 1)), f"start {start}: out of order {tags[:20]}"
            tasks = {id(task) for task, _ in handed}
            assert len(tasks) == 1, f"start {start}: {len(tasks)} tasks handed the deliveries over"
        await channel.queue_delete(queue_name)


@pytest.mark.parametrize("path", ["inline", "aio-pika"])
async def test_a_delivery_whose_handover_fails_comes_back_and_no_later_ack_settles_it(
    queue_name: str, path: str
) -> None:
    """A delivery `on_delivery` raised on is handed back to the broker, never acked past unseen.

    It is in no buffer: skipped, the next batch's multiple ack (here: the ack
    of the delivery after it) would settle it at the broker unprocessed. Both
    ways a `DirectConsumer` is reached: the channel's reader (`DirectQueue`),
    and aio-pika's own `Queue.consume`, as a consumer aio-pika restores is.
    """
    connection = await connect([AMQP_URL], name="test-direct-failed-handover")
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue_name)
        for n in range(3):
            await publish_confirmed(channel, aio_pika.Message(str(n).encode()), queue_name)
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=10)
        queue = await consuming.declare_queue(queue_name, passive=True)
        seen: list[int] = []
        failed: list[int] = []
        acks: set[asyncio.Task[None]] = set()
        back = asyncio.Event()

        def on_delivery(delivery: Delivery) -> None:
            n = int(delivery.body)
            if n == 1 and not failed:
                failed.append(n)
                raise RuntimeError("a handover that fails once")
            seen.append(n)
            if n == 2:  # as a batch acks: every delivery of the channel up to this one
                ack = asyncio.get_running_loop().create_task(delivery.ack(multiple=True))
                acks.add(ack)
                ack.add_done_callback(acks.discard)
            if n == 1:
                back.set()

        consumer = cast(Any, DirectConsumer(on_delivery))
        if path == "inline":
            await queue.consume(consumer)
        else:
            await aio_pika.RobustQueue.consume(cast(aio_pika.RobustQueue, queue), consumer)
        try:
            async with asyncio.timeout(ANSWER_S):
                await back.wait()
        except TimeoutError:
            pytest.fail(f"delivery 1 never came back in {ANSWER_S:g} s; handed over: {seen}")
        assert failed == [1]
        await channel.queue_delete(queue_name)


@needs_rabbitmqctl
async def test_direct_consumer_is_restored_after_the_broker_drops_the_connection(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    seen: list[str] = []
    async with Worker(_recording_app(queue_name, retry_policy, seen), settings) as worker:
        closed = await asyncio.to_thread(
            close_broker_connections, f"idempotent-workers {worker.worker_id}"
        )
        assert closed == 1

        async def restored() -> bool:
            return await _direct_consumers(worker) == 1

        await wait_for(restored, timeout=30)
        await publisher.publish(queue_name, {"n": 2}, message_id="after-reconnect")

        async def committed() -> bool:
            return await _effects(db, "after-reconnect") == 1

        await wait_for(committed, timeout=30)
    assert seen == ["after-reconnect"]
