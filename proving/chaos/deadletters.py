"""Watch the dead-letter queues during the run: what arrived, why, and when.

The watcher takes dead letters off `<queue>.dlq` as they come (acking after
it has recorded them), so the time a poison message took to be dead-lettered
is measured, not guessed. It reconnects across broker restarts; a dead letter
it saw twice (a worker killed between its dead-letter publish and its ack
publishes it again) is recorded once, with its copies counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import structlog

from consumers import ATTEMPT_HEADER, REASON_HEADER, dead_letter_queue
from consumers.pipeline.settle import DEAD_LETTERED_AT_HEADER
from proving.chaos.poison import MARK_HEADER
from proving.deadlines import within

log = structlog.get_logger(__name__)

STOP_DEADLINE_S = 15.0


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    queue: str
    message_id: str
    reason: str
    attempt: int
    seen_at: float  # monotonic, when the watcher first took it
    mark: str = ""  # x-chaos-mark: a decode poison's name in the run
    stamped_at: float = 0.0  # wall clock, the worker's x-dead-lettered-at (0: none)


def _reason(message: aio_pika.abc.AbstractIncomingMessage) -> str:
    headers = message.headers or {}
    reason = headers.get(REASON_HEADER)
    if reason:
        return reason.decode() if isinstance(reason, bytes) else str(reason)
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        why = deaths[0].get("reason", "unknown")  # e.g. delivery_limit
        return f"broker:{why.decode() if isinstance(why, bytes) else why!s}"
    return "none"


def _stamped_at(message: aio_pika.abc.AbstractIncomingMessage) -> float:
    raw = (message.headers or {}).get(DEAD_LETTERED_AT_HEADER)
    return raw / 1000 if isinstance(raw, int) and not isinstance(raw, bool) else 0.0


def _attempt(message: aio_pika.abc.AbstractIncomingMessage) -> int:
    raw = (message.headers or {}).get(ATTEMPT_HEADER, 1)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 1


class DeadLetterWatcher:
    def __init__(self, url: str | Sequence[str], queues: Sequence[str]) -> None:
        # One address, or a cluster's: the next one after every failure.
        self.urls = [url] if isinstance(url, str) else list(url)
        self._tries = 0
        self.queues = list(queues)
        self.seen: dict[tuple[str, str], DeadLetter] = {}
        self.copies = 0  # dead letters seen more than once
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="dead-letter-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            # The cancel alone is not enough: on Python 3.11 a cancel that lands
            # as a get's reply is in is dropped by the wait_for aiormq bounds the
            # get with, and the loop would poll on for ever. It also ends at its
            # next turn, each of whose waits is bounded (a get 5 s, an ack 5 s).
            self._stopping = True
            self._task.cancel()
            await within(
                STOP_DEADLINE_S,
                "the dead-letter watcher to end once cancelled",
                asyncio.gather(self._task, return_exceptions=True),
            )

    async def drain(self) -> None:
        """Take whatever is left (the broker must be up)."""
        url = self._next_url()
        connection = await aio_pika.connect(url, timeout=10)
        try:
            channel = await within(10, f"a channel on {url}", connection.channel())
            while await self._take_all(channel):
                pass
        finally:
            await within(10, f"closing the watcher's connection to {url}", connection.close())

    async def _run(self) -> None:
        while not self._stopping:
            try:
                connection = await aio_pika.connect(self._next_url(), timeout=5)
            except Exception:
                await asyncio.sleep(0.5)
                continue
            try:
                channel = await asyncio.wait_for(connection.channel(), 5)  # expiry: reconnect
                while not self._stopping:
                    if not await self._take_all(channel):
                        await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.info("dead_letter_watcher_reconnecting", error=repr(exc))
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(connection.close(), 2)

    def _next_url(self) -> str:
        self._tries += 1
        return self.urls[(self._tries - 1) % len(self.urls)]

    async def _take_all(self, channel: aio_pika.abc.AbstractChannel) -> int:
        taken = 0
        for queue_name in self.queues:
            queue = await channel.get_queue(dead_letter_queue(queue_name), ensure=False)
            while (message := await queue.get(no_ack=False, fail=False, timeout=5)) is not None:
                # A decode poison is known by its mark: its message_id may be unusable.
                mark = (message.headers or {}).get(MARK_HEADER)
                mark = mark if isinstance(mark, str) else ""
                key = (queue_name, mark or message.message_id or "")
                if key in self.seen:
                    self.copies += 1
                else:
                    self.seen[key] = DeadLetter(
                        queue=queue_name,
                        message_id=message.message_id or "",
                        reason=_reason(message),
                        attempt=_attempt(message),
                        seen_at=time.monotonic(),
                        mark=mark,
                        stamped_at=_stamped_at(message),
                    )
                await asyncio.wait_for(message.ack(), 5)
                taken += 1
        return taken
