"""The headline promises, with real worker processes, SIGKILL and SIGTERM."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import asyncpg

from consumers import Publisher
from dedupe import DbConnection, available_migrations, quote_ident
from tests.conftest import AMQP_URL, DATABASE_URL, Spawn
from tests.support import (
    ROOT,
    WorkerProcess,
    drain_dead_letters,
    no_message_ready,
    settle,
    wait_consumers,
    wait_declared,
    wait_for,
)


async def _count(db: DbConnection, sql: str) -> int:
    value: int = await db.fetchval(sql)
    return value


async def _effects(db: DbConnection) -> int:
    return await _count(db, "SELECT count(*) FROM effects")


async def test_worker_killed_inside_handler_before_commit_applies_effect_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    tmp_path: Path,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    marker = tmp_path / "in-handler"
    first = spawn({"TEST_HOLD_MARKER": str(marker)})
    await wait_declared(AMQP_URL, queue_name)
    await publisher.publish(queue_name, {"n": 1, "hold_s": 60}, message_id="held")

    async def holding() -> bool:
        return marker.exists()

    await wait_for(holding, timeout=30)
    # The INSERT ran inside the open transaction; kill before COMMIT.
    first.kill()
    await first.expect_exit(-signal.SIGKILL)
    assert await _effects(db) == 0  # rolled back with the process

    # The redelivered message has hold_s too; this worker does not hold.
    second = spawn({"TEST_HOLD_MARKER": ""})
    await wait_for(lambda: _has(db, 1), timeout=30)
    await settle(lambda: _effects(db), quiet=1.0)
    rows = await db.fetch("SELECT worker_pid FROM effects")
    assert [r["worker_pid"] for r in rows] == [second.pid]
    assert await drain_dead_letters(channel, queue_name) == []


async def test_worker_killed_after_commit_before_ack_applies_effect_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    first = spawn({"PROVING_CRASH_AT": "after_commit"})
    await wait_declared(AMQP_URL, queue_name)
    for n in range(50):
        await publisher.publish(queue_name, {"n": n}, message_id=f"order-{n}")
    assert await first.wait(timeout=30) == -signal.SIGKILL  # crashed after its first commit
    committed = await _effects(db)
    assert committed >= 1
    crashed_rows = await _count(db, f"SELECT count(*) FROM effects WHERE worker_pid = {first.pid}")
    assert crashed_rows == committed

    second = spawn()
    await wait_for(lambda: _has(db, 50), timeout=30)
    await settle(lambda: _effects(db), quiet=1.0)
    second.terminate()
    await second.expect_exit(0)
    per_message = await db.fetch(
        "SELECT message_id, count(*) AS c FROM effects GROUP BY message_id"
    )
    assert len(per_message) == 50
    assert all(r["c"] == 1 for r in per_message)
    # The committed-but-unacked messages did come back, and were ignored.
    assert second.log_text().count("duplicate_ignored") == committed
    assert await drain_dead_letters(channel, queue_name) == []


async def test_message_published_concurrently_to_four_competing_workers_applies_once(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    # One worker declares the queues and consumes before the others start:
    # RabbitMQ 3.10 closes a connection with 541 INTERNAL_ERROR ({error,noproc} in
    # rabbit_quorum_queue:consume) when it consumes from a quorum queue another
    # connection declared a moment ago, and such a worker exits 3 (seen in a
    # fresh-clone run); a supervisor would restart it, these bare workers are not.
    env = {"IW_PREFETCH": "10", "IW_MAX_BATCH": "5"}
    workers = [spawn(env)]
    await wait_consumers(AMQP_URL, queue_name, 1)
    workers += [spawn(env) for _ in range(3)]
    await wait_consumers(AMQP_URL, queue_name, 4)

    async def publish_copies(copy: int) -> None:
        pub, connection = await Publisher.connect(AMQP_URL)
        try:
            await asyncio.gather(
                *(pub.publish(queue_name, {"n": n}, message_id=f"race-{n}") for n in range(300))
            )
        finally:
            await connection.close()

    await asyncio.gather(*(publish_copies(c) for c in range(4)))
    await wait_for(lambda: _has(db, 300), timeout=60)
    # Every copy taken off the queue, not only every effect made: on a busy
    # machine 93 duplicates were still waiting when the effects had settled,
    # and a stopped worker leaves them for the next one.
    await wait_for(lambda: no_message_ready(AMQP_URL, queue_name), timeout=60)
    await settle(lambda: _effects(db), quiet=1.5)
    for worker in workers:
        worker.terminate()
    for worker in workers:
        await worker.expect_exit(0)
    per_message = await db.fetch(
        "SELECT message_id, count(*) AS c FROM effects GROUP BY message_id"
    )
    assert len(per_message) == 300
    assert all(r["c"] == 1 for r in per_message)
    pids = {r["worker_pid"] for r in await db.fetch("SELECT DISTINCT worker_pid FROM effects")}
    assert len(pids) >= 2, "the copies were not spread over competing workers"
    ignored = sum(w.log_text().count("duplicate_ignored") for w in workers)
    assert ignored == 900
    assert not any("batch_failed" in w.log_text() for w in workers)
    assert await drain_dead_letters(channel, queue_name) == []


async def test_sigterm_under_load_loses_nothing_and_doubles_nothing(
    db: DbConnection,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    channel: aio_pika.abc.AbstractChannel,
) -> None:
    total = 3000
    first = spawn({"IW_MAX_BATCH": "50", "IW_PREFETCH": "200"})
    other = spawn({"IW_MAX_BATCH": "50", "IW_PREFETCH": "200"})
    await wait_declared(AMQP_URL, queue_name)
    await asyncio.gather(
        *(publisher.publish(queue_name, {"n": n}, message_id=f"load-{n}") for n in range(total))
    )
    await wait_for(lambda: _has(db, 300), timeout=60)
    first.terminate()  # mid-run: it must settle what it holds and exit cleanly
    await first.expect_exit(0, timeout=30)
    assert "worker_stopped" in first.log_text()
    replacement = spawn()
    # Past its imports before it is told to stop: a SIGTERM that lands while
    # Python is still importing dies of the default action (-15), not ours.
    await replacement.wait_logged("worker_started")
    await wait_for(lambda: _has(db, total), timeout=90)
    await settle(lambda: _effects(db), quiet=1.5)
    other.terminate()
    replacement.terminate()
    await other.expect_exit(0)
    await replacement.expect_exit(0)
    per_message = await db.fetch(
        "SELECT message_id, count(*) AS c FROM effects GROUP BY message_id"
    )
    assert len(per_message) == total
    assert all(r["c"] == 1 for r in per_message)
    assert await drain_dead_letters(channel, queue_name) == []


async def test_migrations_run_by_four_processes_at_once_make_one_schema(schema: str) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": DATABASE_URL,
        "DATABASE_SCHEMA": schema,
        "PYTHONPATH": str(ROOT),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "consumers", "migrate"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outputs = []
    for proc in procs:
        while proc.poll() is None:
            await asyncio.sleep(0.05)
        out, err = proc.communicate()
        outputs.append((proc.returncode, out.decode(), err.decode()))
    conn = await asyncpg.connect(DATABASE_URL)
    try:
        assert [code for code, _, _ in outputs] == [0, 0, 0, 0], outputs
        shipped = [m.version for m in available_migrations()]
        applied = [o for _, o, _ in outputs if f"applied={shipped}" in o]
        assert len(applied) == 1, outputs  # exactly one process applied them
        versions = await conn.fetch(
            f"SELECT version FROM {quote_ident(schema)}.schema_migrations ORDER BY version"
        )
        assert [r["version"] for r in versions] == shipped
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await conn.close()


async def _has(db: DbConnection, n: int) -> bool:
    return await _count(db, "SELECT count(*) FROM processed_messages") >= n


async def test_sigterm_while_starting_abandons_the_start_and_exits_cleanly(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def never_answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accept the connection, say nothing: a database that hangs

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    env = {**worker_env, "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/postgres"}
    worker = WorkerProcess("tests.apps.effects:app", env, tmp_path / "starting.log")
    try:
        await wait_for(lambda: _connected(held), timeout=30)  # start() is under way
        worker.terminate()
        await worker.expect_exit(0, timeout=15)
        assert "start_abandoned" in worker.log_text()
    finally:
        worker.stop_now()
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def _connected(held: list[asyncio.StreamWriter]) -> bool:
    return bool(held)
