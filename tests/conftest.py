"""Fixtures against the real RabbitMQ and PostgreSQL: a fresh schema and queue per test."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from pathlib import Path

import aio_pika
import asyncpg
import pytest
import structlog

from consumers import (
    AmqpSettings,
    DatabaseSettings,
    Publisher,
    RetryPolicy,
    Settings,
    WorkerSettings,
)
from consumers.broker.topology import delete
from dedupe import DbConnection, migrate, quote_ident
from proving.chaos.cluster import LocalCluster
from proving.chaos.patroni import PatroniCluster, new_workdir
from proving.chaos.replicas import StandbyPair
from proving.deadlines import ANSWER_S, within
from tests.apps.effects import FAST_RETRY
from tests.harness import Harness
from tests.support import WorkerProcess

pytest_plugins = ["consumers.testing.pytest_plugin", "providers.fakes.pytest_plugin"]

AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
DATABASE_URL = os.environ.get("TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

# The delay tiers of every RetryPolicy in the test suite and the default one.
TEST_TIERS_SECONDS = (0.2, 0.3, 0.5, 0.6, 1.0, 1.2, 2.0, 5.0, 30.0, 120.0, 600.0, 3600.0, 86400.0)

EFFECTS_TABLE = """
CREATE TABLE effects (
    id          bigserial PRIMARY KEY,
    consumer    text NOT NULL,
    tenant      text NOT NULL,
    message_id  text NOT NULL,
    body        text NOT NULL,
    worker_pid  integer NOT NULL
)"""


@pytest.fixture
def schema() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
async def db(schema: str) -> AsyncIterator[DbConnection]:
    """A connection to a freshly migrated schema holding an `effects` table."""
    conn = await asyncpg.connect(DATABASE_URL, timeout=ANSWER_S)
    await migrate(conn, schema)
    await conn.execute(f"SET search_path TO {quote_ident(schema)}", timeout=ANSWER_S)
    await conn.execute(EFFECTS_TABLE, timeout=ANSWER_S)
    yield conn
    await conn.execute(f"DROP SCHEMA {quote_ident(schema)} CASCADE", timeout=ANSWER_S)
    await conn.close()


@pytest.fixture
async def local_cluster(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    """A 3-node RabbitMQ cluster of its own, on free ports; killed after, whatever happens."""
    async with LocalCluster(tmp_path / "cluster") as cluster:
        yield cluster


@pytest.fixture
async def standby_pair() -> AsyncIterator[StandbyPair]:
    """A PostgreSQL primary and its synchronous standby of their own; killed after."""
    workdir = Path(tempfile.mkdtemp(prefix="iw-pair-"))
    os.chmod(workdir, 0o755)  # the servers run as the postgres user
    async with StandbyPair(workdir) as pair:
        yield pair


@pytest.fixture
async def patroni_cluster() -> AsyncIterator[PatroniCluster]:
    """Three PostgreSQL nodes under Patroni with one etcd, synchronous; killed after."""
    async with PatroniCluster(new_workdir()) as cluster:
        yield cluster


@pytest.fixture
def retry_policy() -> RetryPolicy:
    return FAST_RETRY


@pytest.fixture
async def queue_name(retry_policy: RetryPolicy) -> AsyncIterator[str]:
    """A unique queue name; its queues (work, tiers, dead letters) are deleted after."""
    name = f"test.{uuid.uuid4().hex[:12]}"
    yield name
    # Whatever policy the test's app had: every tier the test apps use, so no
    # quorum queue outlives its test on the shared broker (deleting a queue
    # that does not exist is a no-op).
    every_tier = sorted({*retry_policy.tiers_seconds, *TEST_TIERS_SECONDS})
    connection = await aio_pika.connect(AMQP_URL, timeout=ANSWER_S)
    channel = await within(ANSWER_S, "a channel to the broker", connection.channel())
    await delete(channel, name, RetryPolicy(tiers_seconds=tuple(every_tier)))
    await connection.close()


@pytest.fixture
async def channel() -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(AMQP_URL, timeout=ANSWER_S)
    yield await within(ANSWER_S, "a channel to the broker", connection.channel())
    await connection.close()


@pytest.fixture
async def publisher() -> AsyncIterator[Publisher]:
    pub, connection = await within(
        ANSWER_S, "a publisher's connection", Publisher.connect(AMQP_URL)
    )
    yield pub
    await connection.close()


@pytest.fixture
def settings(schema: str) -> Settings:
    return Settings(
        amqp=AmqpSettings(urls=(AMQP_URL,)),
        database=DatabaseSettings(url=DATABASE_URL, schema=schema),
        worker=WorkerSettings(shutdown_grace_seconds=10),
    )


@pytest.fixture
def worker_env(schema: str, queue_name: str) -> dict[str, str]:
    """The environment of a worker process running `tests.apps.effects:app`."""
    return {
        "AMQP_URL": AMQP_URL,
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": schema,
        "TEST_QUEUE": queue_name,
        "IW_SHUTDOWN_GRACE": "15",
    }


Spawn = Callable[..., WorkerProcess]


# Set on a test's item when its call failed: its worker processes' logs are printed.
CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def worker_logs_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that failed while worker processes ran (a wait that timed out, say)
    keeps and prints each one's log, as a worker that exited wrongly does: the
    failure explains itself."""
    WorkerProcess.started.clear()
    yield
    if request.node.stash.get(CALL_FAILED, False):
        for worker in WorkerProcess.started:
            worker.keep_log("ran in a test that failed")
    WorkerProcess.started.clear()


@pytest.fixture
def spawn(worker_env: dict[str, str], tmp_path: Path) -> Iterator[Spawn]:
    """Start worker processes of the sample app; every one is reaped after the test."""
    started: list[WorkerProcess] = []

    def start(
        extra_env: dict[str, str] | None = None,
        *,
        args: Sequence[str] = (),
        target: str = "tests.apps.effects:app",
    ) -> WorkerProcess:
        worker = WorkerProcess(
            target,
            worker_env,
            tmp_path / f"worker-{len(started)}.log",
            extra_env=extra_env,
            args=args,
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop_now()


@pytest.fixture
async def harness(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    settings: Settings,
    retry_policy: RetryPolicy,
    channel: aio_pika.abc.AbstractChannel,
) -> AsyncIterator[Harness]:
    """Database, queue, publisher and settings for an in-process worker; its outcome lines."""
    with structlog.testing.capture_logs() as logs:
        yield Harness(
            db=db,
            queue=queue_name,
            publisher=publisher,
            settings=settings,
            retry=retry_policy,
            channel=channel,
            logs=logs,
        )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist, the `slow` tests take turns on one worker.

    Each starts services of its own (a RabbitMQ cluster, a Patroni cluster, the
    chaos run's node and PostgreSQL): one at a time they leave the other worker
    a core for the rest of the suite (`make test` runs `-n 2 --dist loadgroup`).
    """
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.xdist_group("heavy"))
