"""Jobs published by the world's clients, pika and kombu themselves, into a real worker.

kombu's JSON serializer sets `content_encoding='utf-8'` on every message and
pika users often do the same: for a JSON body that names the text's charset,
not a transform, so each such job has its one effect. A real transform
(gzip, deflate, binary, kombu's `compression`) is refused as
`unsupported_content_encoding`. Every job is published twice with the same
message_id (a publisher's retry): one effect each, never a second.

Both publishers ask for publisher confirms and publish a nacked message again,
as a careful publisher does: only a confirm says the broker took the message.
RabbitMQ has refused a publish to a quorum queue declared a moment before (see
`tests.support.publish_confirmed`); without confirms kombu drops such a job
unseen, and a test waiting for its outcome waits for a job that never came.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import aio_pika
import amqp.exceptions
import kombu
import pika
import pika.exceptions
import pytest

from consumers import REASON_HEADER
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from tests.conftest import AMQP_URL, Spawn
from tests.support import (
    ROOT,
    WorkerProcess,
    drain_dead_letters,
    queue_counts,
    wait_declared,
    wait_for,
)

OUTCOMES = ("effect_committed", "duplicate_ignored", "dead_lettered", "retry_scheduled")


@dataclass(frozen=True, slots=True, kw_only=True)
class PikaJob:
    message_id: str
    body: bytes
    content_type: str | None = "application/json"
    content_encoding: str | None = None


# Between a nack and the next publish of the same message.
NACK_PAUSE_S = 0.1


def until_confirmed(publish: Callable[[], None], nacked: type[Exception], what: str) -> None:
    """`publish()` until the broker confirms it, at most ANSWER_S seconds.

    A nack says the broker did not take the message (RabbitMQ's quorum queue
    refuses a channel's first publish while it cannot register the publisher),
    so it is published again, as `tests.support.publish_confirmed` does.
    """
    deadline = time.monotonic() + ANSWER_S
    while True:
        try:
            publish()
            return
        except nacked:
            print(f"{what} nacked; again")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} nacked for {ANSWER_S} s") from None
            time.sleep(NACK_PAUSE_S)


def pika_publish(queue: str, jobs: Sequence[PikaJob], *, times: int = 2) -> None:
    """Publish each job `times` times, as pika's own tutorial does, with confirms."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for _ in range(times):
            for job in jobs:
                properties = pika.BasicProperties(
                    message_id=job.message_id,
                    content_type=job.content_type,
                    content_encoding=job.content_encoding,
                    delivery_mode=pika.DeliveryMode.Persistent,
                )
                until_confirmed(
                    partial(
                        channel.basic_publish,
                        "",
                        queue,
                        job.body,
                        properties=properties,
                        mandatory=True,
                    ),
                    pika.exceptions.NackError,
                    f"pika's publish of {job.message_id!r}",
                )
    finally:
        connection.close()


def kombu_publish(
    queue: str, bodies: dict[str, dict[str, int]], *, times: int = 2, compression: str | None = None
) -> None:
    """Publish each body `times` times with kombu's JSON serializer, as Celery services do.

    With publisher confirms (kombu's `confirm_publish`, as Celery's
    `broker_transport_options` set it), each publish waits for its confirm.
    """
    options = {"confirm_publish": True}
    with kombu.Connection(AMQP_URL, transport_options=options) as connection:
        producer = connection.Producer(serializer="json")
        for _ in range(times):
            for message_id, body in bodies.items():
                until_confirmed(
                    partial(
                        producer.publish,
                        body,
                        exchange="",
                        routing_key=queue,
                        message_id=message_id,
                        delivery_mode=2,
                        compression=compression,
                        retry=True,
                        timeout=ANSWER_S,  # the confirm's, too
                    ),
                    amqp.exceptions.MessageNacked,
                    f"kombu's publish of {message_id!r}",
                )


async def by_pika(queue: str, jobs: Sequence[PikaJob], *, times: int = 2) -> None:
    """`pika_publish` in a thread; its confirms all come within one deadline."""
    publishes = asyncio.to_thread(pika_publish, queue, jobs, times=times)
    await within(ANSWER_S, f"pika's confirmed publishes to {queue}", publishes)


async def by_kombu(
    queue: str, bodies: dict[str, dict[str, int]], *, times: int = 2, compression: str | None = None
) -> None:
    """`kombu_publish` in a thread; its confirms all come within one deadline."""
    publishes = asyncio.to_thread(
        kombu_publish, queue, bodies, times=times, compression=compression
    )
    await within(ANSWER_S, f"kombu's confirmed publishes to {queue}", publishes)


async def effects_by_id(db: DbConnection) -> dict[str, int]:
    rows = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    return {r["message_id"]: r["n"] for r in rows}


async def claims(db: DbConnection) -> int:
    count: int = await db.fetchval("SELECT count(*) FROM processed_messages")
    return count


def outcomes(worker: WorkerProcess) -> Counter[tuple[str, str]]:
    """(message_id, outcome) of every outcome line the worker logged."""
    return Counter(
        (str(line.get("message_id")), name) for name in OUTCOMES for line in worker.events(name)
    )


async def wait_outcomes(worker: WorkerProcess, n: int, queue: str) -> Counter[tuple[str, str]]:
    """Wait until the worker has logged `n` outcome lines (one per delivery); return them.

    On timeout, fail saying which lines came and what `queue` still holds: a
    job the broker never took and a job the worker never settled differ there.
    """

    async def logged() -> bool:
        return sum(outcomes(worker).values()) >= n

    try:
        await wait_for(logged, timeout=60)
    except AssertionError as late:
        counts = await queue_counts(AMQP_URL, queue)
        raise AssertionError(
            f"{late}: {n} outcome lines awaited, {sorted(outcomes(worker).items())} logged;"
            f" {queue} (ready, consumers): {counts}"
        ) from None
    return outcomes(worker)


def body(n: int) -> bytes:
    return json.dumps({"n": n}).encode()


ACCEPTED = [
    PikaJob(message_id="plain", body=body(1)),
    PikaJob(message_id="charset", body=body(2), content_type="application/json; charset=utf-8"),
    PikaJob(message_id="utf-8", body=body(3), content_encoding="utf-8"),
    PikaJob(message_id="UTF-8", body=body(4), content_encoding="UTF-8"),
    PikaJob(message_id="utf8", body=body(5), content_encoding="utf8"),
    PikaJob(
        message_id="both",
        body=body(6),
        content_type="application/json; charset=UTF-8",
        content_encoding="UTF-8",
    ),
    PikaJob(message_id="no-type", body=body(7), content_type=None),
]


async def test_pika_jobs_in_every_usual_form_have_one_effect_each_retry_included(
    db: DbConnection, queue_name: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> None:
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    await by_pika(queue_name, ACCEPTED)
    seen = await wait_outcomes(worker, 2 * len(ACCEPTED), queue_name)
    ids = [job.message_id for job in ACCEPTED]
    assert seen == Counter(
        {
            **{(i, "effect_committed"): 1 for i in ids},
            **{(i, "duplicate_ignored"): 1 for i in ids},
        }
    )
    assert await effects_by_id(db) == dict.fromkeys(ids, 1)
    assert await drain_dead_letters(channel, queue_name) == []


async def test_kombu_json_jobs_have_one_effect_each_retry_included(
    db: DbConnection, queue_name: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> None:
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    bodies = {f"kombu-{n}": {"n": n} for n in range(3)}
    await by_kombu(queue_name, bodies)
    seen = await wait_outcomes(worker, 2 * len(bodies), queue_name)
    assert seen == Counter(
        {
            **{(i, "effect_committed"): 1 for i in bodies},
            **{(i, "duplicate_ignored"): 1 for i in bodies},
        }
    )
    assert await effects_by_id(db) == dict.fromkeys(bodies, 1)
    assert await drain_dead_letters(channel, queue_name) == []


async def test_kombu_sets_the_utf8_content_encoding_this_suite_accepts(
    channel: aio_pika.abc.AbstractChannel, queue_name: str
) -> None:
    """What kombu puts on the wire, read back: the case above is the one the issue saw."""
    await channel.declare_queue(queue_name, durable=True)
    await by_kombu(queue_name, {"seen": {"n": 1}}, times=1)
    queue = await channel.get_queue(queue_name)
    message = await queue.get(no_ack=True, timeout=10)
    assert (message.content_type, message.content_encoding) == ("application/json", "utf-8")
    assert message.message_id == "seen"


REFUSED = [
    PikaJob(message_id="gzip", body=gzip.compress(body(1)), content_encoding="gzip"),
    PikaJob(message_id="deflate", body=zlib.compress(body(2)), content_encoding="deflate"),
    PikaJob(message_id="binary", body=body(3), content_encoding="binary"),
    PikaJob(message_id="latin-1", body=body(4), content_encoding="latin-1"),
]


async def test_real_transforms_stay_refused_with_their_reason(
    db: DbConnection, queue_name: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> None:
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    await by_pika(queue_name, REFUSED, times=1)
    await by_kombu(queue_name, {"kombu-gzip": {"n": 5}}, times=1, compression="gzip")
    ids = [*(job.message_id for job in REFUSED), "kombu-gzip"]
    seen = await wait_outcomes(worker, len(ids), queue_name)
    assert seen == Counter({(i, "dead_lettered"): 1 for i in ids})
    dead = await drain_dead_letters(channel, queue_name)
    reasons = {d.message_id: d.headers[REASON_HEADER] for d in dead}
    assert reasons == dict.fromkeys(ids, "unsupported_content_encoding")
    assert await effects_by_id(db) == {}
    assert await claims(db) == 0


async def test_a_40_mb_job_from_pika_is_dead_lettered_whole_and_the_next_job_has_its_effect(
    db: DbConnection, queue_name: str, spawn: Spawn, channel: aio_pika.abc.AbstractChannel
) -> None:
    """Past the worker's body limit (IW_MAX_BODY_BYTES, 1 MiB) by 40 times, well under
    RabbitMQ's own (128 MiB): refused as `body_too_large`, kept byte for byte in the
    dead-letter queue, and the job behind it goes on as usual."""
    worker = spawn()
    await wait_declared(AMQP_URL, queue_name)
    huge = json.dumps({"n": 1, "pad": "x" * 40_000_000}).encode()
    jobs = [PikaJob(message_id="huge", body=huge), PikaJob(message_id="after", body=body(2))]
    await by_pika(queue_name, jobs, times=1)
    seen = await wait_outcomes(worker, 2, queue_name)
    assert seen == Counter({("huge", "dead_lettered"): 1, ("after", "effect_committed"): 1})
    dead = await drain_dead_letters(channel, queue_name)
    assert [(d.message_id, d.headers[REASON_HEADER]) for d in dead] == [("huge", "body_too_large")]
    assert dead[0].body == huge
    assert await effects_by_id(db) == {"after": 1}


GUIDE = ROOT / "docs" / "other-clients.md"


def guide_snippet(section: str) -> str:
    """The first ```python block under `## {section}` in docs/other-clients.md."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {section}\n")
    block = text.index("```python\n", start) + len("```python\n")
    return text[block : text.index("\n```", block)]


@pytest.mark.parametrize("client", ["pika", "kombu"])
async def test_the_guides_snippets_publish_a_job_of_the_contract(
    channel: aio_pika.abc.AbstractChannel, queue_name: str, client: str
) -> None:
    """docs/other-clients.md's pika and kombu examples, run as printed (the queue
    renamed): each publishes one job, confirmed, with the contract's properties."""
    await channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "quorum"})
    code = guide_snippet(client).replace('"orders.shipped"', repr(queue_name))
    assert repr(queue_name) in code
    await within(ANSWER_S, f"the guide's {client} snippet", asyncio.to_thread(exec, code, {}))
    queue = await channel.get_queue(queue_name)
    message = await queue.get(no_ack=True, timeout=ANSWER_S)
    assert message.message_id == "order-1042-shipped"
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert (message.headers or {}).get("x-tenant") == "acme"
    assert json.loads(message.body) == {"order_id": 1042}
