"""The dead-letter watcher stops even when the cancel of its stop is lost.

The cluster profile hung after its drain, idle, with its connections open:
`DeadLetterWatcher.stop()` cancelled the watcher's task and awaited it. The
task polls the dead-letter queues with `queue.get(timeout=5)`, which aiormq
bounds with `asyncio.wait_for`; on Python 3.11 a cancel that lands once the
awaited reply is in (the get answered, the task not yet resumed) is dropped:
wait_for returns the reply. The task's `while True` then polled on, and the
stop waited for it for ever. Here the cancel is made to land in that window
(found by reading the task's own await chain), then the stop must end.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from proving.chaos.deadletters import STOP_DEADLINE_S, DeadLetterWatcher
from proving.deadlines import within
from tests.conftest import AMQP_URL


def _reply_in_not_resumed(task: asyncio.Task[None]) -> bool:
    """The task waits in a wait_for whose awaited future is already done."""
    coro: object = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None)
        if frame is not None and frame.f_code.co_name == "wait_for":
            inner = frame.f_locals.get("fut")
            return isinstance(inner, asyncio.Future) and inner.done()
        coro = getattr(coro, "cr_await", None)
    return False


@pytest.fixture
async def dead_letter_queue() -> AsyncIterator[str]:
    """A queue `<name>.dlq` on the shared broker, empty; deleted after."""
    name = f"test.watch.{uuid.uuid4().hex[:8]}"
    connection = await aio_pika.connect(AMQP_URL, timeout=10)
    channel = await connection.channel()
    await channel.declare_queue(f"{name}.dlq", arguments={"x-queue-type": "quorum"}, durable=True)
    yield name
    await channel.queue_delete(f"{name}.dlq")
    await connection.close()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="wait_for keeps the cancel from 3.12 on")
async def test_a_stop_whose_cancel_lands_as_a_get_answers_still_ends(
    dead_letter_queue: str,
) -> None:
    watcher = DeadLetterWatcher(AMQP_URL, [dead_letter_queue])
    watcher.start()
    task = watcher._task
    assert task is not None
    async with asyncio.timeout(60):  # polls every 0.1 s: the window comes within seconds
        while not _reply_in_not_resumed(task):
            await asyncio.sleep(0)
    stopping = asyncio.create_task(watcher.stop())  # its cancel lands now, in the window
    await within(STOP_DEADLINE_S * 2, "the watcher's stop after a lost cancel", stopping)
    assert task.done()
