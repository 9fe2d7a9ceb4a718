"""Group commit: the requests of one commit each get their own answer, whatever the others do."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import asyncpg
import orjson
import pytest

from dedupe import (
    Acceptance,
    Accepted,
    DbConnection,
    Messages,
    NewMessage,
    fingerprint,
    job_message_id,
)
from dedupe.lost import CONNECTION_ERRORS
from ingress.commit import Committer
from tests.conftest import DATABASE_URL


class RecordingMessages(Messages):
    """The real tables, and the size of every group the committer sent them."""

    def __init__(self, schema: str) -> None:
        super().__init__(schema)
        self.groups: list[int] = []

    async def accept(self, conn: DbConnection, requests: Sequence[NewMessage]) -> list[Accepted]:
        self.groups.append(len(requests))
        return await super().accept(conn, requests)


@pytest.fixture
async def messages(db: DbConnection, schema: str) -> RecordingMessages:
    return RecordingMessages(schema)


@pytest.fixture
async def committer(messages: RecordingMessages) -> AsyncIterator[Committer]:
    pool = await asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=2)
    committer = Committer(pool, messages, lanes=1)
    committer.start()
    try:
        yield committer
    finally:
        await committer.stop()
        await pool.close()


def request(key: str, title: str = "Shipped", tenant: str = "acme") -> NewMessage:
    job = {"targets": [{"platform": "ios", "token": "t-1"}], "notification": {"title": title}}
    return NewMessage(
        tenant=tenant,
        idempotency_key=key,
        fingerprint=fingerprint(job),
        queue="test.push",
        targets=1,
        job=orjson.dumps(job),
    )


async def one_group(
    committer: Committer, requests: Sequence[NewMessage]
) -> list[Accepted | BaseException]:
    """Submit all at once: every submission is waiting before the lane takes any."""
    return await asyncio.gather(*(committer.submit(r) for r in requests), return_exceptions=True)


async def rows(db: DbConnection) -> tuple[int, int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM ingress_idempotency_keys),"
        " (SELECT count(*) FROM ingress_messages), (SELECT count(*) FROM outbox)"
    )
    assert row is not None
    return (row[0], row[1], row[2])


async def test_twenty_identical_requests_in_one_group_make_one_message(
    committer: Committer, messages: RecordingMessages, db: DbConnection
) -> None:
    answers = await one_group(committer, [request("k-same")] * 20)
    assert messages.groups == [20]
    assert isinstance(answers[0], Accepted) and answers[0].outcome is Acceptance.QUEUED
    first = answers[0].id
    assert answers[1:] == [Accepted(outcome=Acceptance.DUPLICATE_IGNORED, id=first)] * 19
    assert await rows(db) == (1, 1, 1)
    assert first is not None
    assert await db.fetchval("SELECT message_id FROM outbox") == job_message_id(first)


async def test_new_duplicate_and_reused_keys_in_one_group_each_get_their_answer(
    committer: Committer, messages: RecordingMessages, db: DbConnection
) -> None:
    [old] = await one_group(committer, [request("k-old")])
    assert isinstance(old, Accepted)
    answers = await one_group(
        committer,
        [
            request("k-new"),  # queued
            request("k-old"),  # committed before: duplicate_ignored, its first id
            request("k-old", title="Other"),  # committed before, other body: reused
            request("k-new"),  # the same as the first of this group: duplicate_ignored
            request("k-twice"),  # queued
            request("k-twice", title="Other"),  # the group's first had another body: reused
            request("k-old", tenant="globex"),  # keys are per tenant: queued
        ],
    )
    assert messages.groups == [1, 7]
    assert all(isinstance(a, Accepted) for a in answers)
    outcomes = [a.outcome for a in answers if isinstance(a, Accepted)]
    ids = [a.id for a in answers if isinstance(a, Accepted)]
    queued, duplicate, reused = (
        Acceptance.QUEUED,
        Acceptance.DUPLICATE_IGNORED,
        Acceptance.KEY_REUSED,
    )
    assert outcomes == [queued, duplicate, reused, duplicate, queued, reused, queued]
    assert ids[1] == old.id and ids[3] == ids[0] and ids[2] is None and ids[5] is None
    assert len({ids[0], ids[4], ids[6], old.id}) == 4
    assert await rows(db) == (4, 4, 4)


async def test_one_requests_failure_is_not_its_groupmates(
    committer: Committer, messages: RecordingMessages, db: DbConnection
) -> None:
    # PostgreSQL's text cannot hold NUL: the statement of any group with this key fails.
    answers = await one_group(
        committer, [request("k-1"), request("k-\x00-bad"), request("k-2"), request("k-1")]
    )
    assert messages.groups == [4, 1, 1, 1, 1]  # refused as a group, then each alone
    assert isinstance(answers[1], asyncpg.PostgresError)
    good = [a for n, a in enumerate(answers) if n != 1]
    assert all(isinstance(a, Accepted) for a in good)
    assert [a.outcome for a in good if isinstance(a, Accepted)] == [
        Acceptance.QUEUED,
        Acceptance.QUEUED,
        Acceptance.DUPLICATE_IGNORED,
    ]
    assert await rows(db) == (2, 2, 2)


async def test_a_group_the_database_refuses_stores_nothing_and_every_request_hears_it(
    committer: Committer, db: DbConnection
) -> None:
    await db.execute("ALTER TABLE ingress_messages RENAME TO ingress_messages_away")
    try:
        answers = await one_group(committer, [request("k-1"), request("k-2"), request("k-1")])
    finally:
        await db.execute("ALTER TABLE ingress_messages_away RENAME TO ingress_messages")
    assert all(isinstance(a, asyncpg.UndefinedTableError) for a in answers)
    assert await rows(db) == (0, 0, 0)
    [again] = await one_group(committer, [request("k-1")])
    assert isinstance(again, Accepted) and again.outcome is Acceptance.QUEUED


async def test_a_lost_connection_answers_its_group_503_and_the_lane_takes_another(
    messages: RecordingMessages, db: DbConnection
) -> None:
    backends: list[int] = []

    async def remember(conn: asyncpg.Connection) -> None:
        backends.append(conn.get_server_pid())

    pool = await asyncpg.create_pool(DATABASE_URL, min_size=1, max_size=2, init=remember)
    committer = Committer(pool, messages, lanes=1)
    committer.start()
    try:
        [first] = await one_group(committer, [request("k-1")])
        assert isinstance(first, Accepted)
        for pid in list(backends):  # this pool's sessions only: the database is shared
            await db.execute("SELECT pg_terminate_backend($1, 5000)", pid)  # waits till gone
        lost = await one_group(committer, [request("k-2"), request("k-3")])
        assert messages.groups[-1] == 2  # not run again one by one: the connection is gone
        assert all(isinstance(a, CONNECTION_ERRORS) for a in lost), lost
        again = await one_group(committer, [request("k-2"), request("k-3")])
        assert [a.outcome for a in again if isinstance(a, Accepted)] == [Acceptance.QUEUED] * 2
    finally:
        await committer.stop()
        await pool.close()
    assert await rows(db) == (3, 3, 3)
