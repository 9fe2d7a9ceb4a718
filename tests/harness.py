"""One fixture for a test that runs a worker in-process: database, queue, publisher, settings.

    async def test_something(harness: Harness) -> None:
        async with harness.run(effects_app(harness.queue, harness.retry)):
            await harness.publish({"n": 1}, message_id="m-1")
            await harness.wait_processed(1)
        assert await harness.effects() == 1

Every wait is on a condition with a deadline. `outcomes` counts the outcome
lines the worker logged (`effect_committed`, `duplicate_ignored`, ...), so a
test can wait for "the duplicate was acked" instead of guessing how long it takes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import aio_pika

from consumers import App, Publisher, RetryPolicy, Settings, Worker, dead_letter_queue
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from tests.support import drain_dead_letters, wait_for

DeadLetter = aio_pika.abc.AbstractIncomingMessage


@dataclass(slots=True, kw_only=True)
class Harness:
    db: DbConnection  # search_path on the test's fresh schema
    queue: str  # a fresh queue name; its queues are deleted after the test
    publisher: Publisher
    settings: Settings
    retry: RetryPolicy
    channel: aio_pika.abc.AbstractChannel
    logs: list[MutableMapping[str, Any]] = field(default_factory=list)

    def run(self, app: App, settings: Settings | None = None) -> Worker:
        """A worker for `app` (use as `async with`), on the harness's services."""
        return Worker(app, settings or self.settings)

    async def publish(
        self, body: Mapping[str, Any] | bytes, *, message_id: str, tenant: str = ""
    ) -> None:
        await within(
            ANSWER_S,
            f"the confirm of {message_id}",
            self.publisher.publish(self.queue, body, message_id=message_id, tenant=tenant),
        )

    async def publish_message(self, message: aio_pika.Message) -> None:
        await self.publisher.publish_message(self.queue, message)

    async def effects(self) -> int:
        count: int = await self.db.fetchval("SELECT count(*) FROM effects", timeout=ANSWER_S)
        return count

    async def processed(self) -> int:
        count: int = await self.db.fetchval(
            "SELECT count(*) FROM processed_messages", timeout=ANSWER_S
        )
        return count

    async def dead_letter_count(self) -> int:
        declared = await self.channel.declare_queue(
            dead_letter_queue(self.queue), passive=True, timeout=ANSWER_S
        )
        return declared.declaration_result.message_count or 0

    async def ready_count(self) -> int:
        declared = await self.channel.declare_queue(self.queue, passive=True, timeout=ANSWER_S)
        return declared.declaration_result.message_count or 0

    def outcomes(self) -> Counter[str]:
        return Counter(str(entry["event"]) for entry in self.logs)

    async def wait_processed(self, n: int, *, timeout: float = 30.0) -> None:
        async def done() -> bool:
            return await self.processed() >= n

        await wait_for(done, timeout=timeout)

    async def wait_dead_letters(self, n: int, *, timeout: float = 30.0) -> None:
        async def done() -> bool:
            return await self.dead_letter_count() >= n

        await wait_for(done, timeout=timeout)

    async def wait_outcome(self, event: str, n: int = 1, *, timeout: float = 30.0) -> None:
        """Wait until the worker has logged `event` (an outcome line) `n` times."""

        async def done() -> bool:
            return self.outcomes()[event] >= n

        await wait_for(done, timeout=timeout)

    async def dead_letters(self) -> list[DeadLetter]:
        """Take every message from the queue's dead-letter queue."""
        return await drain_dead_letters(self.channel, self.queue)
