"""A worker whose start fails on a service says so with its own exit status.

Chaos counted one rolling SIGTERM as "not exiting 0" (issue 8, case 6): its
log showed the process had not failed to stop; its start had failed, an AMQP
connection cut while it set up its second queue, with the SIGTERM crossing it.
A start that fails on a service now exits EXIT_START_FAILED with a
`start_failed` line, which the chaos fleet counts as a start failure. So does
one whose consume the broker refuses, and such a worker stops at once, not
after its shutdown grace.
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace

import aio_pika
import aiormq
import pytest

from consumers import AmqpSettings, App, Context, RetryPolicy, Settings, Worker
from consumers.broker.topology import declare
from consumers.settings import QueueType
from consumers.telemetry.failed_start import EXIT_START_FAILED
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from tests.apps.effects import FAST_RETRY
from tests.conftest import AMQP_URL, Spawn


async def held_exclusively(
    channel: aio_pika.abc.AbstractChannel, queue: str, retry: RetryPolicy, amqp: AmqpSettings
) -> None:
    """Declare the worker's queues as it would, then consume `queue` exclusively.

    A worker's `basic.consume` on it is then refused (ACCESS_REFUSED). Only
    for a classic queue: quorum queues on RabbitMQ 3.10 let a second consumer
    in beside an exclusive one.
    """
    assert amqp.queue_type is QueueType.CLASSIC
    await declare(channel, queue, retry, amqp)

    async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await message.nack()  # nothing is published to it

    held = await channel.get_queue(queue, ensure=False)
    await held.consume(hold, exclusive=True)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_start_that_fails_on_a_service_exits_start_failed_not_a_traceback(
    spawn: Spawn,
) -> None:
    down = f"postgresql://postgres@127.0.0.1:{_closed_port()}/postgres"
    worker = spawn({"DATABASE_URL": down})
    await worker.expect_exit(EXIT_START_FAILED, timeout=60)
    said = worker.log_text()
    assert '"event":"start_failed"' in said.replace(" ", "")
    assert "ConnectionRefusedError" in said


async def test_a_start_refused_at_its_consume_stops_without_waiting_out_the_grace(
    db: DbConnection,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    """A batch loop started for a queue whose consume is then refused is stopped with the rest.

    The queue's exclusive consumer (`held_exclusively`) makes the broker
    refuse the worker's `basic.consume`: the start fails after the loop's
    task began. Nothing was delivered, so `stop()` has nothing to settle and
    closes at once, where it used to wait its whole grace for a loop it did
    not know of. `db` migrates the schema the worker's start checks.
    """
    grace = 60.0
    settings = replace(
        settings,
        amqp=replace(settings.amqp, queue_type=QueueType.CLASSIC),
        worker=replace(settings.worker, shutdown_grace_seconds=grace),
    )
    await held_exclusively(channel, queue_name, retry_policy, settings.amqp)

    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def handle(ctx: Context) -> None:
        raise AssertionError("nothing is delivered to a worker whose consume was refused")

    worker = Worker(app, settings)
    with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
        await within(ANSWER_S, "the worker's start", worker.start())
    began = time.monotonic()
    await within(2 * grace, "the worker's stop", worker.stop())
    took = time.monotonic() - began
    assert took < grace / 2, f"stop took {took:.1f} s of its {grace:.0f} s grace"


async def test_a_consume_the_broker_refuses_exits_start_failed_not_a_traceback(
    db: DbConnection,
    channel: aio_pika.abc.AbstractChannel,
    queue_name: str,
    spawn: Spawn,
) -> None:
    """A queue another client consumes exclusively: one `start_failed` line, exit 3.

    The broker refuses the worker's `basic.consume` (ACCESS_REFUSED), as it
    does a user without read permission on the queue. A restart may find the
    queue free, as it may find a rejected password changed: the same exit as
    a service that refused the start, the broker's words in the line.
    """
    classic = AmqpSettings(urls=(AMQP_URL,), queue_type=QueueType.CLASSIC)
    await held_exclusively(channel, queue_name, FAST_RETRY, classic)

    worker = spawn({"IW_QUEUE_TYPE": "classic"})
    await worker.expect_exit(EXIT_START_FAILED, timeout=60)
    said = worker.log_text()
    assert '"event":"start_failed"' in said.replace(" ", "")
    assert "ACCESS_REFUSED" in said
    assert "Traceback" not in said
