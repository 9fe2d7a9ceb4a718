"""A push batch that is starting holds the next one back: what arrives meanwhile goes as one.

A push loop used to take whatever was buffered the moment one of its 8 batch
slots was free. Under load that made batches of a few jobs (a median of 7 of
500 in the one-device push bench), each paying a claim and a recording
transaction of its own. Now, while a batch is starting (taken, not yet past its
first recorded answers), the next waits for a full batch, that recording, or
`STARTING_SECONDS`, whichever comes first (`consumers.pipeline.loop`). A silent
device still holds back only its own job: `tests/test_push_head_of_line.py`.
"""

from __future__ import annotations

import asyncio

from consumers import Publisher, Settings, Worker, push_job_body
from consumers.telemetry.metrics import PREFIX
from dedupe import DbConnection
from providers import Platform, Target
from providers.fakes.apns import FakeApns
from tests.conftest import AMQP_URL
from tests.providers.pushes import apns_push_app, requested, sent
from tests.support import no_message_ready, wait_for

BEHIND = 20  # jobs published one by one while the first batch is starting


async def test_jobs_arriving_while_a_batch_starts_wait_for_its_first_answers_and_go_as_one(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    fake_apns: FakeApns,
) -> None:
    answer = asyncio.Event()
    fake_apns.script("held-device-xxxx", until=answer)
    app = apns_push_app(queue_name, fake_apns, timeout=10.0)
    async with Worker(app, settings) as worker:
        held = Target(platform=Platform.IOS, token="held-device-xxxx")
        await publisher.publish(queue_name, push_job_body(targets=[held], body="x"), message_id="a")
        await wait_for(lambda: requested(fake_apns, 1))  # its batch is starting
        for n in range(BEHIND):  # each confirmed before the next: they arrive one by one
            device = Target(platform=Platform.IOS, token=f"behind-device-{n:04d}")
            body = push_job_body(targets=[device], body="x")
            await publisher.publish(queue_name, body, message_id=f"behind-{n}")
        await wait_for(lambda: no_message_ready(AMQP_URL, queue_name))  # all in the worker
        answer.set()
        await wait_for(lambda: sent(db, 1 + BEHIND), timeout=60)
        registry = worker.metrics.registry
        labels = {"consumer": queue_name}
        batches = registry.get_sample_value(f"{PREFIX}batch_messages_count", labels)
        messages = registry.get_sample_value(f"{PREFIX}batch_messages_sum", labels)
    assert (batches, messages) == (2, 1 + BEHIND), "the first job's batch, then one of the rest"
