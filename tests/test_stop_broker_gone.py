"""A worker asked to stop while its broker is gone stops within its grace.

A robust channel whose connection is down waits for the connection to come
back before it sends anything, a consumer's cancel included: a stop that
cancels its consumers that way waits as long as the broker stays away (in
the chaos run, 55 s past a 10 s grace, a slot with no worker all along).
"""

from __future__ import annotations

import dataclasses
import time

from yarl import URL

from consumers import App, Context, RetryPolicy, Settings, Worker
from consumers.pipeline.loop import CANCEL_TIMEOUT_SECONDS
from dedupe import DbConnection
from proving.chaos.proxy import FaultProxy
from proving.chaos.services import free_port
from proving.deadlines import within
from tests.conftest import AMQP_URL
from tests.support import wait_consumers, wait_for


async def test_stop_while_the_broker_is_gone_ends_within_the_grace(
    db: DbConnection, queue_name: str, settings: Settings, retry_policy: RetryPolicy
) -> None:
    proxy = FaultProxy("broker", free_port(), URL(AMQP_URL).port or 5672)
    await proxy.start()
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        del ctx

    grace = 2.0
    via_proxy = dataclasses.replace(
        settings,
        amqp=dataclasses.replace(
            settings.amqp, urls=(f"amqp://guest:guest@127.0.0.1:{proxy.port}/",)
        ),
        worker=dataclasses.replace(settings.worker, shutdown_grace_seconds=grace),
    )
    worker = Worker(app, via_proxy)
    # What the stop promises: the grace for in-flight batches, a bounded cancel
    # of each consumer, then the closes (10 s for those).
    limit = grace + CANCEL_TIMEOUT_SECONDS * len(app.specs) + 10.0
    took = 0.0
    try:
        await within(60, "the worker to start through the proxy", worker.start())
        await wait_consumers(AMQP_URL, queue_name, 1, timeout=30)
        await proxy.close()  # the broker is gone: connections reset, new ones refused

        async def noticed() -> bool:
            return "rabbitmq: not connected" in (await worker.readiness()).detail

        await wait_for(noticed, timeout=30)  # reconnecting now, every few seconds
        began = time.monotonic()
        await within(limit * 3, "the worker's stop with the broker gone", worker.stop())
        took = time.monotonic() - began
    finally:
        await proxy.close()
        await within(limit * 3, "the worker's stop", worker.stop())  # idempotent
    assert took <= limit, f"stop took {took:.1f} s with the broker gone (limit {limit:.1f} s)"
