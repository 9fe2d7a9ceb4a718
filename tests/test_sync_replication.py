"""A commit the synchronous standby may not have is never acknowledged, nor answered 202.

A real primary and standby (`proving.chaos.replicas`): the standby stopped, the
worker's COMMIT waits for it; cancelling (or terminating) that wait leaves the
transaction committed on the primary only. The worker must not ack it; its
re-run waits for the standby again; the primary dies, the standby is promoted,
and the message is applied there exactly once.
"""

from __future__ import annotations

import asyncio

import asyncpg
import orjson
import pytest

from consumers import Publisher
from dedupe import (
    Acceptance,
    CommitOutcomeUnknown,
    Messages,
    NewMessage,
    fingerprint,
    migrate,
    quote_ident,
)
from ingress.commit import Committer
from proving.chaos.replicas import StandbyPair
from tests.conftest import AMQP_URL, EFFECTS_TABLE, Spawn
from tests.support import WorkerProcess, no_message_ready, wait_for

ACKED = ("effect_committed", "duplicate_ignored")


async def prepare_effects(url: str, schema: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn, schema)
        await conn.execute(f"SET search_path TO {quote_ident(schema)}")
        await conn.execute(EFFECTS_TABLE)
    finally:
        await conn.close()


async def _effects(url: str, schema: str, message_id: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        count: int = await conn.fetchval(
            f"SELECT count(*) FROM {quote_ident(schema)}.effects WHERE message_id = $1",
            message_id,
        )
    finally:
        await conn.close()
    return count


def _acked(worker: WorkerProcess) -> list[str]:
    return [event for event in ACKED for _ in worker.events(event)]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("interrupt", ["cancel", "terminate"])
async def test_commit_whose_standby_wait_is_interrupted_is_not_acked_and_applies_once(
    standby_pair: StandbyPair,
    schema: str,
    queue_name: str,
    publisher: Publisher,
    spawn: Spawn,
    interrupt: str,
) -> None:
    pair = standby_pair
    await prepare_effects(pair.primary.url, schema)
    worker = spawn({"DATABASE_URL": pair.dsn})
    await worker.wait_logged("worker_started")
    await pair.standby.stop()  # fast shutdown: every writing COMMIT waits from now on
    began = await pair.cancel_waiting_commits()  # none yet: the primary's clock
    await publisher.publish(queue_name, {"n": 1}, message_id="sync-1")
    await pair.wait_commits_waiting(1, since=began)
    interrupted = await pair.cancel_waiting_commits(terminate=interrupt == "terminate")

    # Either the worker acks (the commit taken for a success) or its re-run's
    # COMMIT waits for the standby again: whichever comes first decides.
    rerun = asyncio.create_task(pair.wait_commits_waiting(1, since=interrupted))

    async def decided() -> bool:
        return rerun.done() or bool(_acked(worker))

    await wait_for(decided, timeout=60)
    assert not _acked(worker), f"acked ({_acked(worker)}) a commit the standby never had"
    await rerun

    pair.primary.kill_now()  # SIGKILL: the only copy of the commit dies with it
    await pair.promote()
    await wait_for(lambda: _logged_ack(worker), timeout=120)
    assert await _effects(pair.standby.url, schema, "sync-1") == 1
    assert await no_message_ready(AMQP_URL, queue_name)


async def _logged_ack(worker: WorkerProcess) -> bool:
    return bool(_acked(worker))


def _send_request(key: str) -> NewMessage:
    job = {"targets": [{"platform": "ios", "token": "t-1"}], "notification": {"title": "Hi"}}
    return NewMessage(
        tenant="acme",
        idempotency_key=key,
        fingerprint=fingerprint(job),
        queue="test.push",
        targets=1,
        job=orjson.dumps(job),
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_send_api_gives_no_202_on_a_commit_whose_standby_wait_was_cancelled(
    standby_pair: StandbyPair, schema: str
) -> None:
    pair = standby_pair
    await prepare_effects(pair.primary.url, schema)
    pool = await asyncpg.create_pool(pair.dsn, min_size=1, max_size=2)
    committer = Committer(pool, Messages(schema), lanes=1)
    committer.start()
    try:
        await pair.standby.stop()
        began = await pair.cancel_waiting_commits()  # none yet: the primary's clock
        first = asyncio.create_task(committer.submit(_send_request("k-1")))
        await pair.wait_commits_waiting(1, since=began)
        interrupted = await pair.cancel_waiting_commits()
        with pytest.raises(CommitOutcomeUnknown):
            await asyncio.wait_for(first, 30)
        # The client's retry finds the key; its answer waits for the standby too.
        again = asyncio.create_task(committer.submit(_send_request("k-1")))
        await pair.wait_commits_waiting(1, since=interrupted)
        assert not again.done(), "a duplicate answered on a row only the primary has"
        await pair.standby.start()
        answer = await asyncio.wait_for(again, 60)
        assert answer.outcome is Acceptance.DUPLICATE_IGNORED
    finally:
        await committer.stop()
        await pool.close()
