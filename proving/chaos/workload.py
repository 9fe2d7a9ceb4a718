"""What the chaos run publishes, and a publisher that outlives broker restarts.

The plan: local-effect jobs, about a tenth of them published twice more
(exact duplicates), poison jobs whose handler always raises, and malformed
messages that must be dead-lettered at once. When the plan has handler
timeouts or hangs, a quarter of the local jobs go to chaos.slow instead, and
that many of those carry the `act` that makes them time out or hang once. On top of the planned
duplicates, the publisher republishes (same `message_id`) whatever it could
not get confirmed: after a broker restart that is a whole window of jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import aio_pika
import structlog
from pamqp.commands import Basic

from consumers import TENANT_HEADER
from proving.chaos.app import LOCAL_QUEUE, POISON_QUEUE, SLOW_QUEUE, Act
from proving.chaos.poison import decode_poison
from proving.rawamqp import RawProperties, publish_raw

log = structlog.get_logger(__name__)

TENANTS = ("acme", "globex", "initech")


class JobKind(StrEnum):
    LOCAL = "local"
    DUPLICATE = "duplicate"  # an exact copy of a local or push job, published again
    POISON = "poison"
    MALFORMED = "malformed"
    DECODE_POISON = "decode_poison"  # fails outside the handler: proving.chaos.poison
    PUSH = "push"
    EFFECT = "effect"  # a webhook, Web Push, e-mail or API job (proving.chaos.channels)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    kind: JobKind
    queue: str
    message_id: str
    tenant: str
    body: bytes
    content_type: str = "application/json"
    raw: RawProperties | None = None  # published byte for byte (decode poison)
    expect: str = ""  # the x-reason its dead letter must carry (decode poison)
    act: Act = Act.NONE  # a chaos.slow job's misbehaviour (in its body too)

    def message(self) -> aio_pika.Message:
        return aio_pika.Message(
            self.body,
            message_id=self.message_id,
            content_type=self.content_type,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers={TENANT_HEADER: self.tenant} if self.tenant else None,
        )


def compact_json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def duplicates_of(sources: Sequence[Job], count: int, rng: random.Random) -> list[Job]:
    """`count` exact re-publishes of jobs drawn from `sources`."""
    return [
        Job(
            kind=JobKind.DUPLICATE,
            queue=source.queue,
            message_id=source.message_id,
            tenant=source.tenant,
            body=source.body,
        )
        for source in rng.choices(sources, k=count)
    ]


# (body, content type, message_id suffix): each is bad input with its own reason.
_MALFORMED = (
    (b"{not json", "application/json", ""),  # invalid_json
    (b"[1, 2, 3]", "application/json", ""),  # body_not_json_object
    (b'{"n": NaN}', "application/json", ""),  # invalid_json (NaN)
    (b'{"n": 1}', "text/plain", ""),  # unsupported_content_type
    (b'{"n": 1}', "application/json", "x" * 200),  # message_id_too_long
)


def _acts(originals: int, timeouts: int, hangs: int) -> list[tuple[str, Act]]:
    """Each local original's queue and act: with timeouts or hangs, every fourth goes slow.

    Thinly: each timeout holds its batch for the deadline, again on each re-run
    of the batch, so a queue dense with them falls behind, and what waits in a
    worker's prefetch counts a delivery at each of the run's many disconnects.
    """
    placed = [(LOCAL_QUEUE, Act.NONE)] * originals
    if not timeouts and not hangs:
        return placed
    slow = range(0, originals, 4)
    if len(slow) < timeouts + hangs:
        raise ValueError("too few local jobs for the planned timeouts and hangs")
    misbehave = [Act.HANG] * hangs + [Act.TIMEOUT] * timeouts
    for n, index in enumerate(slow):
        placed[index] = (SLOW_QUEUE, misbehave[n] if n < len(misbehave) else Act.NONE)
    return placed


def _local(n: int, queue: str, act: Act, rng: random.Random) -> Job:
    body: dict[str, object] = {"n": n, "amount": rng.randrange(1, 10_000)}
    if act is not Act.NONE:
        body["act"] = str(act)
    return Job(
        kind=JobKind.LOCAL,
        queue=queue,
        message_id=f"local-{n}",
        tenant=TENANTS[n % len(TENANTS)],
        body=compact_json(body),
        act=act,
    )


def plan(
    *,
    messages: int,
    poison: int,
    malformed: int,
    rng: random.Random,
    decode: int = 0,
    timeouts: int = 0,
    hangs: int = 0,
) -> list[Job]:
    """`messages` publishes in all, shuffled; 10% of the rest are duplicates."""
    rest = messages - poison - malformed - decode
    duplicates = rest // 10
    originals = rest - duplicates
    jobs: list[Job] = [
        _local(n, queue, act, rng)
        for n, (queue, act) in enumerate(_acts(originals, timeouts, hangs))
    ]
    jobs += duplicates_of(jobs[:originals], duplicates, rng)
    for n in range(poison):
        jobs.append(
            Job(
                kind=JobKind.POISON,
                queue=POISON_QUEUE,
                message_id=f"poison-{n}",
                tenant=TENANTS[n % len(TENANTS)],
                body=compact_json({"n": n}),
            )
        )
    for n in range(malformed):
        body, content_type, suffix = _MALFORMED[n % len(_MALFORMED)]
        jobs.append(
            Job(
                kind=JobKind.MALFORMED,
                queue=LOCAL_QUEUE if n % 2 else POISON_QUEUE,
                message_id=f"malformed-{n}{suffix}",
                tenant="",
                body=body,
                content_type=content_type,
            )
        )
    for n, bad in enumerate(decode_poison(decode)):
        jobs.append(
            Job(
                kind=JobKind.DECODE_POISON,
                queue=LOCAL_QUEUE if n % 2 else POISON_QUEUE,
                message_id=bad.mark,
                tenant="",
                body=bad.body,
                raw=bad.properties,
                expect=bad.reason,
            )
        )
    rng.shuffle(jobs)
    return jobs


class ResilientPublisher:
    """Publishes with confirms; anything unconfirmed is published again."""

    def __init__(self, url: str | Sequence[str], *, window: int = 100) -> None:
        # One address, or a cluster's: the next one after every failure.
        self.urls = [url] if isinstance(url, str) else list(url)
        self._tries = 0
        self.window = window
        # (queue, message_id) -> monotonic time of its first confirmed publish:
        # from then on the broker has it (an outage before that is not its wait).
        self.first_sent: dict[tuple[str, str], float] = {}
        self.published = 0  # confirmed publishes
        self.republished = 0  # attempts after a failure
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None
        self._lock = asyncio.Lock()

    async def _ensure(self) -> aio_pika.abc.AbstractExchange:
        async with self._lock:
            while self._exchange is None:
                try:
                    url = self.urls[self._tries % len(self.urls)]
                    self._tries += 1
                    self._connection = await aio_pika.connect(url, timeout=5)
                    channel = await asyncio.wait_for(  # expiry: the next attempt
                        self._connection.channel(publisher_confirms=True), 5
                    )
                    self._exchange = channel.default_exchange
                except Exception as exc:
                    log.info("publisher_reconnecting", error=repr(exc))
                    await self._drop()
                    await asyncio.sleep(0.5)
            return self._exchange

    async def _drop(self) -> None:
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), 2)

    async def publish(self, job: Job) -> None:
        """Until the broker confirms it, whatever happens to the broker."""
        if job.raw is not None:
            await self._publish_raw(job, job.raw)
            return
        attempts = 0
        while True:
            exchange = await self._ensure()
            attempts += 1
            try:
                confirm = await exchange.publish(job.message(), job.queue, timeout=10)
            except Exception as exc:
                log.info("publish_unconfirmed", message_id=job.message_id, error=repr(exc))
                if self._exchange is exchange:
                    await self._drop()
                self.republished += 1
                await asyncio.sleep(0.2)
                continue
            if isinstance(confirm, Basic.Ack):
                self.published += 1
                self.first_sent.setdefault((job.queue, job.message_id), time.monotonic())
                return
            self.republished += 1  # nacked or returned: again, same message_id
            await asyncio.sleep(0.2)

    async def _publish_raw(self, job: Job, properties: RawProperties) -> None:
        """A raw message, on a connection of its own (few of them), until confirmed."""
        while True:
            url = self.urls[self.republished % len(self.urls)]  # a cluster: each in turn
            try:
                await publish_raw(job.queue, job.body, url=url, properties=properties)
            except Exception as exc:
                log.info("publish_unconfirmed", message_id=job.message_id, error=repr(exc))
                self.republished += 1
                await asyncio.sleep(0.2)
                continue
            self.published += 1
            self.first_sent.setdefault((job.queue, job.message_id), time.monotonic())
            return

    async def publish_all(self, jobs: list[Job], *, seconds: float) -> None:
        """Publish `jobs` evenly over about `seconds`, `window` in flight at most."""
        started = time.monotonic()
        gate = asyncio.Semaphore(self.window)
        tasks: set[asyncio.Task[None]] = set()
        pace = seconds / max(len(jobs), 1)

        async def one(job: Job) -> None:
            try:
                await self.publish(job)  # unbounded: until confirmed; callers bound the load
            finally:
                gate.release()

        for n, job in enumerate(jobs):
            due = started + n * pace
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            await gate.acquire()  # unbounded: a slot frees as a publish above ends
            task = asyncio.create_task(one(job))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)

    async def close(self) -> None:
        await self._drop()
