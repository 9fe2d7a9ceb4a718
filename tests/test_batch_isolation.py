"""A batch the framework cannot decide is split until the one message is found.

`runner.run` raising (not a handler: the framework itself) used to hand the
whole batch back to the broker, which redelivered it at once: a loop that
spent every batchmate's delivery-limit. The runner here fails whenever its
batch holds one message, as an unforeseen framework bug would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import aio_pika

from consumers import REASON_HEADER, QueueType, RetryPolicy, Settings, Worker
from consumers.pipeline.deliveries import Delivery
from consumers.pipeline.runner import Runner
from dedupe import DbConnection
from proving.rawamqp import RawProperties
from tests.support import drain_dead_letters, wait_for
from tests.test_decode_poison import GOOD, counting_app, publish_between_good

UNDECIDABLE = "undecidable"


class FailsOn:
    """The real runner, but `run` raises for any batch holding `message_id`."""

    def __init__(self, inner: Runner, message_id: str) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.dispatcher = inner.dispatcher
        self.acks = inner.acks
        self.message_id = message_id

    async def run(self, deliveries: Sequence[Delivery], started: Callable[[], None]) -> None:
        if any(d.message_id == self.message_id for d in deliveries):
            raise RuntimeError("the framework cannot decide this one")
        await self.inner.run(deliveries, started)

    async def close(self) -> None:
        await self.inner.close()


async def test_undecidable_message_is_isolated_and_dead_lettered_and_its_batchmates_commit_once(
    db: DbConnection,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # A classic queue has no delivery-limit: a requeue loop would never end.
    classic = replace(settings, amqp=replace(settings.amqp, queue_type=QueueType.CLASSIC))
    calls: dict[str, int] = {}
    app = counting_app(queue_name, retry_policy, calls)
    async with Worker(app, classic) as worker:
        for loop in worker._loops:
            loop.runner = FailsOn(loop.runner, UNDECIDABLE)
        poison = RawProperties(message_id=UNDECIDABLE)
        await publish_between_good(queue_name, [(poison, b'{"n": -1}')])
        await wait_for(lambda: _effects(db, len(GOOD)), timeout=30)
        await wait_for(lambda: _dead_lettered(channel, queue_name), timeout=30)
    (dead,) = await drain_dead_letters(channel, queue_name)
    assert dead.message_id == UNDECIDABLE
    assert dead.headers[REASON_HEADER] == "max_attempts_exceeded:framework_error"
    assert "cannot decide this one" in str(dead.headers["x-error"])
    assert calls == dict.fromkeys(GOOD, 1)  # each good one ran once: no extra delivery


async def _effects(db: DbConnection, n: int) -> bool:
    count: int = await db.fetchval("SELECT count(*) FROM effects")
    return count >= n


async def _dead_lettered(channel: aio_pika.abc.AbstractChannel, queue: str) -> bool:
    declared = await channel.declare_queue(f"{queue}.dlq", passive=True)
    return (declared.declaration_result.message_count or 0) >= 1
