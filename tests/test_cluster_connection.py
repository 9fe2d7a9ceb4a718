"""Several broker addresses: the first that answers, then the next after a loss."""

from __future__ import annotations

import dataclasses
import itertools
import os
import uuid
from pathlib import Path

import pytest
import structlog
from yarl import URL

from consumers import App, Context, Publisher, RetryPolicy, Settings, Worker
from consumers.broker.connection import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    ClusterConnection,
    connect,
    connect_once,
    redacted,
)
from dedupe import DbConnection
from proving.chaos.proxy import FaultProxy
from proving.chaos.services import PrivateRabbit, free_port
from tests.conftest import AMQP_URL
from tests.support import wait_for


def _via(port: int) -> str:
    return str(URL(AMQP_URL).with_host("127.0.0.1").with_port(port))


def test_amqp_url_takes_a_comma_separated_list_and_url_is_the_first() -> None:
    settings = Settings.from_env({"AMQP_URL": "amqp://a:5672/, amqp://b:5673/,,amqp://c/"})
    assert settings.amqp.urls == ("amqp://a:5672/", "amqp://b:5673/", "amqp://c/")
    assert settings.amqp.url == "amqp://a:5672/"
    assert Settings.from_env({}).amqp.urls == (Settings().amqp.url,)
    with pytest.raises(ValueError, match="no broker address"):
        Settings.from_env({"AMQP_URL": " , "})


async def test_connect_skips_an_address_that_does_not_answer() -> None:
    dead = _via(free_port())  # nothing listens there
    connection = await connect([dead, AMQP_URL], name="test: skips a dead address")
    try:
        assert isinstance(connection, ClusterConnection)
        assert connection.url == URL(AMQP_URL)
    finally:
        await connection.close()


async def test_worker_moves_to_the_next_address_when_its_node_goes_away(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
) -> None:
    """Two addresses (proxies to one broker): the first vanishes mid-run, nothing is lost."""
    upstream = URL(AMQP_URL).port or 5672
    first = FaultProxy("first", free_port(), upstream)
    second = FaultProxy("second", free_port(), upstream)
    await first.start()
    await second.start()
    app = App(retry=retry_policy)

    @app.handler(queue_name)
    async def record(ctx: Context) -> None:
        await ctx.tx.execute(
            "INSERT INTO effects (consumer, tenant, message_id, body, worker_pid)"
            " VALUES ('x', '', $1, '', 0)",
            ctx.message_id,
        )

    async def effects(n: int) -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM effects") >= n)

    two = dataclasses.replace(
        settings,
        amqp=dataclasses.replace(settings.amqp, urls=(_via(first.port), _via(second.port))),
    )
    try:
        with structlog.testing.capture_logs() as logs:
            async with Worker(app, two) as worker:
                for n in range(50):
                    await publisher.publish(queue_name, {"n": n}, message_id=f"before-{n}")
                await wait_for(lambda: effects(50), timeout=60)
                assert second.connections == 0  # all on the first address so far
                await first.close()  # the node is gone: refused and reset
                for n in range(50):
                    await publisher.publish(queue_name, {"n": n}, message_id=f"after-{n}")
                await wait_for(lambda: effects(100), timeout=90)
                assert isinstance(worker._connection, ClusterConnection)
                assert worker._connection.url == URL(_via(second.port))
                assert second.connections >= 1
    finally:
        await first.close()
        await second.close()
    moved = [e for e in logs if e["event"] == "amqp_address_moved"]
    assert moved and moved[0]["next"] == redacted(_via(second.port))
    rows = await db.fetch("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert len(rows) == 100
    assert all(row["n"] == 1 for row in rows)


@pytest.mark.timeout(180)
async def test_refused_addresses_are_tried_round_the_list_with_jittered_growing_delays(
    tmp_path: Path,
) -> None:
    """Both addresses gone: the next one each time, waits within the backoff bound, then back."""
    rabbit = PrivateRabbit(
        tmp_path / "rabbit",
        free_port(),
        free_port(),
        node=f"iwconn-{os.getpid()}-{uuid.uuid4().hex[:6]}@localhost",
    )
    await rabbit.start()
    first = FaultProxy("first", free_port(), rabbit.port)
    second = FaultProxy("second", free_port(), rabbit.port)
    await first.start()
    await second.start()
    urls = [f"amqp://guest:guest@127.0.0.1:{p}/" for p in (first.port, second.port)]
    connection = await connect(urls, name="test: refused round the list")
    assert isinstance(connection, ClusterConnection)
    try:
        with structlog.testing.capture_logs() as logs:
            await first.close()  # both addresses refuse from now on
            await second.close()

            async def failed(n: int) -> bool:
                return connection.failures >= n

            await wait_for(lambda: failed(4), timeout=90)
            back = FaultProxy("first again", first.port, rabbit.port)
            await back.start()
            await wait_for(lambda: _connected(connection), timeout=90)
            # The one-shot tools' connection (dlq, inspect) skips the dead address too.
            plain = await connect_once([urls[1], urls[0]])
            await plain.close()
            await back.close()
        moved = [e for e in logs if e["event"] == "amqp_address_moved"]
        assert moved[0]["was_open"] is True and moved[0]["retry_in_s"] == 0.0
        refused = [e for e in moved if not e["was_open"]]
        assert len(refused) >= 4
        for entry in refused:  # full jitter under a doubling cap
            assert (
                0.0
                <= entry["retry_in_s"]
                <= min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** entry["failures"])
            )
        nexts = [e["next"] for e in moved]
        assert all(a != b for a, b in itertools.pairwise(nexts))  # round the list
        assert connection.failures == 0  # reset once connected
    finally:
        await connection.close()
        await rabbit.stop()
        rabbit.kill_now()


async def _connected(connection: ClusterConnection) -> bool:
    return connection.connected.is_set()
