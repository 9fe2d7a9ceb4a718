"""A queue someone else declared with other arguments: a configuration error, found first.

Each case declares one of the worker's queues the way another client would
(pika, as its tutorial does), then starts a real worker process. The
promise: one `start_failed` JSON line naming the queue, what we declare, what
the broker refused and what the queue holds; no traceback; exit 78
(EX_CONFIG); nothing declared. Under `--processes N` the supervisor restarts
no child and exits 78 itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
from collections.abc import Mapping
from typing import Any

import aio_pika
import pika
import pytest

from consumers import AmqpSettings, App, Context, Settings, Worker, dead_letter_queue, tier_queue
from consumers.broker.conflicts import TopologyConflict, check_broker
from consumers.broker.topology import declarations, declare, tier_arguments
from consumers.telemetry.failed_start import EXIT_CONFIG
from dedupe import DbConnection
from proving.deadlines import ANSWER_S, within
from tests.apps.effects import FAST_RETRY
from tests.conftest import AMQP_URL, Spawn
from tests.support import WorkerProcess

TIER = FAST_RETRY.tiers_seconds[0]


def pika_declare(
    queue: str, arguments: Mapping[str, Any] | None = None, *, durable: bool = True
) -> None:
    """`queue_declare(q, durable=True)`, as a publisher following pika's tutorial does."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=durable, arguments=dict(arguments or {}))
    finally:
        connection.close()


async def existing(queues: list[str]) -> list[str]:
    """Those of `queues` that exist on the broker."""
    found = []
    connection = await aio_pika.connect(AMQP_URL)
    try:
        for queue in queues:
            channel = await connection.channel()
            try:
                await channel.declare_queue(queue, passive=True)
                found.append(queue)
                await channel.close()
            except aio_pika.exceptions.ChannelNotFoundEntity:
                pass
    finally:
        await connection.close()
    return found


def every_queue(queue: str) -> list[str]:
    return [d.name for d in declarations(queue, FAST_RETRY, AmqpSettings(urls=(AMQP_URL,)))]


def refused_start(worker: WorkerProcess) -> dict[str, Any]:
    """The worker's one start_failed line; every line of its log is JSON (no traceback)."""
    for text in worker.log_text().splitlines():
        json.loads(text)  # a traceback line fails here, and shows itself
    (line,) = worker.events("start_failed")
    return line


async def test_a_classic_work_queue_refuses_the_start_with_78_and_nothing_declared(
    db: DbConnection, queue_name: str, spawn: Spawn
) -> None:
    await asyncio.to_thread(pika_declare, queue_name)
    worker = spawn()
    await worker.expect_exit(EXIT_CONFIG, timeout=60)
    line = refused_start(worker)
    assert line["queue"] == queue_name
    assert line["declared"]["x-queue-type"] == "quorum"
    assert line["refused"].startswith("PRECONDITION_FAILED")
    # Every argument the broker compares that the classic queue lacks, its type
    # included (a queue without x-queue-type is classic); it does not compare a
    # classic queue's x-delivery-limit.
    assert line["existing"] == {
        "x-dead-letter-exchange": None,
        "x-dead-letter-routing-key": None,
        "x-queue-type": None,
    }
    assert await existing(every_queue(queue_name)) == [queue_name]


async def test_a_transient_work_queue_is_told_apart_by_its_durability_too(
    db: DbConnection, queue_name: str, spawn: Spawn
) -> None:
    """pika's first tutorial declares `queue_declare(queue=q)`: not durable, classic."""
    await asyncio.to_thread(pika_declare, queue_name, durable=False)
    worker = spawn()
    await worker.expect_exit(EXIT_CONFIG, timeout=60)
    line = refused_start(worker)
    assert line["queue"] == queue_name and line["declared"]["durable"] is True
    assert line["existing"] == {
        "durable": False,
        "x-dead-letter-exchange": None,
        "x-dead-letter-routing-key": None,
        "x-queue-type": None,
    }
    assert await existing(every_queue(queue_name)) == [queue_name]


async def test_a_quorum_work_queue_without_our_dead_letter_arguments_refuses_the_start(
    db: DbConnection, queue_name: str, spawn: Spawn
) -> None:
    await asyncio.to_thread(pika_declare, queue_name, {"x-queue-type": "quorum"})
    worker = spawn()
    await worker.expect_exit(EXIT_CONFIG, timeout=60)
    line = refused_start(worker)
    assert line["queue"] == queue_name
    assert line["declared"]["x-dead-letter-routing-key"] == dead_letter_queue(queue_name)
    assert line["existing"] == {
        "x-dead-letter-exchange": None,
        "x-dead-letter-routing-key": None,
        "x-delivery-limit": None,
    }
    assert await existing(every_queue(queue_name)) == [queue_name]


async def test_a_retry_tier_with_another_ttl_refuses_the_start(
    db: DbConnection, queue_name: str, spawn: Spawn
) -> None:
    tier = tier_queue(queue_name, TIER)
    ours = tier_arguments(queue_name, TIER, AmqpSettings(urls=(AMQP_URL,)))
    other_ttl = ours["x-message-ttl"] + 1
    await asyncio.to_thread(pika_declare, tier, {**ours, "x-message-ttl": other_ttl})
    worker = spawn()
    await worker.expect_exit(EXIT_CONFIG, timeout=60)
    line = refused_start(worker)
    assert line["queue"] == tier
    assert line["declared"]["x-message-ttl"] == ours["x-message-ttl"]
    assert line["existing"] == {"x-message-ttl": other_ttl}
    assert await existing(every_queue(queue_name)) == [tier]


async def test_the_supervisor_restarts_no_child_refused_by_configuration_and_exits_78(
    db: DbConnection, queue_name: str, spawn: Spawn
) -> None:
    await asyncio.to_thread(pika_declare, queue_name)
    supervisor = spawn(args=["--processes", "2"])
    await supervisor.expect_exit(EXIT_CONFIG, timeout=90)
    assert supervisor.events("process_restart_scheduled") == []
    assert [line["exit_code"] for line in supervisor.events("supervisor_stopped")] == [EXIT_CONFIG]
    assert EXIT_CONFIG in {line["exit_code"] for line in supervisor.events("process_exited")}
    assert "Traceback" not in supervisor.log_text()
    assert await existing(every_queue(queue_name)) == [queue_name]


async def test_a_conflict_the_declare_itself_meets_is_a_topology_conflict(
    channel: aio_pika.abc.AbstractChannel, queue_name: str
) -> None:
    """Declared otherwise between the check and the declare: the same error, not a crash."""
    await asyncio.to_thread(pika_declare, queue_name)
    with pytest.raises(TopologyConflict) as raised:
        await declare(channel, queue_name, FAST_RETRY, AmqpSettings(urls=(AMQP_URL,)))
    assert raised.value.queue == queue_name
    assert raised.value.refused.startswith("PRECONDITION_FAILED")


def broker_channels(connection_name: str) -> int:
    """How many channels the broker holds open on the connection named `connection_name`."""
    listed = subprocess.run(
        ["rabbitmqctl", "list_connections", "channels", "client_properties", "-q"],
        check=True,
        capture_output=True,
        text=True,
    )
    for line in listed.stdout.splitlines():
        channels, _, properties = line.partition("\t")
        if f'{{"connection_name","{connection_name}"}}' in properties:
            return int(channels)
    raise AssertionError(f"no connection named {connection_name!r}:\n{listed.stdout}")


async def test_the_check_leaves_no_channel_open_behind_it(
    db: DbConnection, queue_name: str, settings: Settings
) -> None:
    """Every queue missing on a first start costs the check a channel the broker closes:
    none of them may come back to life on the worker's own connection."""
    app = App(retry=FAST_RETRY)

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        pass

    async with Worker(app, settings) as worker:
        held = broker_channels(f"idempotent-workers {worker.worker_id}")
    # The publisher-confirms channel, and one per batch loop.
    assert held == 1 + settings.worker.concurrency * len(app.specs)


class _Errors(logging.Handler):
    """aiormq's records at ERROR and above: a traceback in the worker's log."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


STOPS = 30  # moments spread over one whole check; with aiormq's own cancel, 16 of 40 raised


async def test_a_stop_during_the_check_ends_it_without_an_error_of_the_broker(
    queue_name: str,
) -> None:
    """SIGTERM while a worker starts cancels its topology check (`start_abandoned`).

    Cancelled in the middle of a declare the broker refuses, aiormq closed the
    channel itself after the broker had closed it: RabbitMQ then closed the
    whole connection with CHANNEL_ERROR and aiormq logged a traceback into the
    worker's log (test_the_supervisor_restarts_no_child_refused_by_configuration_and_exits_78
    saw one in CI).
    """
    await asyncio.to_thread(pika_declare, queue_name)
    urls = (AMQP_URL,)
    ours = declarations(queue_name, FAST_RETRY, AmqpSettings(urls=urls))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TopologyConflict):
        await check_broker(urls, ours)
    whole = loop.time() - started
    errors = _Errors()
    logging.getLogger("aiormq").addHandler(errors)
    try:
        for n in range(STOPS):
            checking = asyncio.create_task(check_broker(urls, ours))
            await asyncio.sleep(whole * n / STOPS)
            checking.cancel()
            with contextlib.suppress(asyncio.CancelledError, TopologyConflict):
                await within(ANSWER_S, "a cancelled check", checking)
    finally:
        logging.getLogger("aiormq").removeHandler(errors)
    assert errors.messages == [], f"{len(errors.messages)} of {STOPS} stops: {errors.messages[0]}"
    assert await existing(every_queue(queue_name)) == [queue_name]
