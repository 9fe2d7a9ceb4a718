"""Claims across generations: one effect per key however claims and rotations interleave.

The race test runs the same rounds against our claims, our send API's keys and a
naive design: ours (`dedupe.generations`:
claims hold the rotation lock shared and look up the older generations) and the
naive one (each claim writes the partition of its own time, the only unique
index is that partition's), which this module builds for itself. A round: three
connections claim one new message id, each twice (a delivery and a
redelivery), while a fourth rotates; each claim that answers NEW writes an
effect row in the same transaction.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from datetime import timedelta
from typing import Protocol

import asyncpg
import pytest

from dedupe import (
    Acceptance,
    Claim,
    ClaimOutcome,
    DbConnection,
    DedupeKey,
    Inbox,
    Messages,
    NewMessage,
    Retention,
    cleanup,
    generations,
)
from dedupe.generations import INGRESS_KEYS, PROCESSED_MESSAGES
from proving.deadlines import ANSWER_S, within
from tests.conftest import DATABASE_URL

ROUNDS = 300
CLAIMERS = 3
KEEP_GENERATIONS = 3  # the race test's retention: older ones are dropped as it goes
FINGERPRINT = b"\x01"


class Design(Protocol):
    async def claim(self, conn: asyncpg.Connection, message_id: str) -> bool: ...
    async def rotate(self, conn: asyncpg.Connection) -> None: ...


class Generations:
    """Ours: `Inbox.claim` and the cleaner's rotation, on the schema's real tables."""

    family = PROCESSED_MESSAGES

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.inbox = Inbox(schema)

    async def claim(self, conn: asyncpg.Connection, message_id: str) -> bool:
        key = DedupeKey(consumer="race", tenant="", message_id=message_id)
        [outcome] = await self.inbox.claim(conn, [Claim(key=key, fingerprint=FINGERPRINT)])
        return outcome is ClaimOutcome.NEW

    async def rotate(self, conn: asyncpg.Connection) -> None:
        await generations.rotate(conn, self.schema, self.family)
        await generations.make_ahead(conn, self.schema, self.family)
        ended = [
            g
            for g in await generations.live(conn, self.schema, self.family)
            if g.ended_at is not None
        ]
        for old in ended[:-KEEP_GENERATIONS]:
            await generations.drop(conn, self.schema, self.family, old.number)


class IngressKeys(Generations):
    """Ours for the send API's idempotency keys: `Messages.accept`, the same rotation."""

    family = INGRESS_KEYS

    async def claim(self, conn: asyncpg.Connection, message_id: str) -> bool:
        request = NewMessage(
            tenant="t",
            idempotency_key=message_id,
            fingerprint=FINGERPRINT,
            queue="push",
            targets=1,
            job=b"{}",
        )
        [accepted] = await Messages(self.schema).accept(conn, [request])
        return accepted.outcome is Acceptance.QUEUED


class Naive:
    """Partitions by the claim's own time: a unique key per partition, no lookup, no lock."""

    def __init__(self, schema: str) -> None:
        self.schema = schema

    async def create(self, conn: DbConnection) -> None:
        await conn.execute(
            "CREATE TABLE naive_claims (consumer text NOT NULL, tenant text NOT NULL,"
            " message_id text NOT NULL, fingerprint bytea NOT NULL, bucket integer NOT NULL,"
            " PRIMARY KEY (consumer, tenant, message_id, bucket)) PARTITION BY LIST (bucket);"
            " CREATE TABLE naive_claims_0 PARTITION OF naive_claims FOR VALUES IN (0);"
            " CREATE TABLE naive_claims_1 PARTITION OF naive_claims FOR VALUES IN (1);"
            " CREATE TABLE naive_now (bucket integer NOT NULL); INSERT INTO naive_now VALUES (0)"
        )

    async def claim(self, conn: asyncpg.Connection, message_id: str) -> bool:
        return bool(
            await conn.fetchval(
                "INSERT INTO naive_claims SELECT 'race', '', $1, $2, bucket FROM naive_now"
                " ON CONFLICT DO NOTHING RETURNING true",
                message_id,
                FINGERPRINT,
            )
        )

    async def rotate(self, conn: asyncpg.Connection) -> None:
        bucket = await conn.fetchval("UPDATE naive_now SET bucket = bucket + 1 RETURNING bucket")
        await conn.execute(
            f"CREATE TABLE naive_claims_{bucket + 1} PARTITION OF naive_claims"
            f" FOR VALUES IN ({bucket + 1})"
        )


async def _connections(schema: str, count: int) -> list[asyncpg.Connection]:
    return [
        await asyncpg.connect(
            DATABASE_URL, server_settings={"search_path": schema}, timeout=ANSWER_S
        )
        for _ in range(count)
    ]


async def _race(design: Design, schema: str, db: DbConnection) -> dict[str, int]:
    """ROUNDS rounds; the effects each message id got."""
    await db.execute("CREATE TABLE race_effects (message_id text NOT NULL, worker int NOT NULL)")
    conns = await _connections(schema, CLAIMERS + 1)
    rotator, claimers = conns[0], conns[1:]
    rng = random.Random(55)
    try:
        for n in range(ROUNDS):
            message_id = f"m-{n}"

            async def deliver(
                conn: asyncpg.Connection, worker: int, skew: int, message_id: str = message_id
            ) -> None:
                for _ in range(skew):  # a varying head start, in round trips, not in sleeps
                    await conn.fetchval("SELECT 1")
                for _delivery in range(2):  # a delivery, then its redelivery
                    async with conn.transaction():
                        if await design.claim(conn, message_id):
                            await conn.execute(
                                "INSERT INTO race_effects VALUES ($1, $2)", message_id, worker
                            )

            async def rotate(skew: int) -> None:
                for _ in range(skew):
                    await rotator.fetchval("SELECT 1")
                await design.rotate(rotator)

            await within(
                ANSWER_S,
                f"round {n}: {CLAIMERS} claimers and a rotation",
                asyncio.gather(
                    rotate(rng.randrange(4)),
                    *(deliver(c, w, rng.randrange(4)) for w, c in enumerate(claimers)),
                ),
            )
    finally:
        for conn in conns:
            await conn.close()
    rows = await db.fetch("SELECT message_id, count(*) FROM race_effects GROUP BY message_id")
    return {r[0]: r[1] for r in rows}


async def test_claims_racing_rotations_apply_each_message_once(
    db: DbConnection, schema: str
) -> None:
    effects = await _race(Generations(schema), schema, db)
    assert len(effects) == ROUNDS
    assert {m: n for m, n in effects.items() if n != 1} == {}
    # The rounds did cross generations: each rotated once.
    now = await generations.current(db, schema, PROCESSED_MESSAGES)
    assert now.number == ROUNDS


async def test_send_api_requests_racing_rotations_queue_each_key_once(
    db: DbConnection, schema: str
) -> None:
    effects = await _race(IngressKeys(schema), schema, db)
    assert len(effects) == ROUNDS
    assert {m: n for m, n in effects.items() if n != 1} == {}
    assert await db.fetchval("SELECT count(*) FROM ingress_messages") == ROUNDS
    assert (await generations.current(db, schema, INGRESS_KEYS)).number == ROUNDS


async def test_the_same_race_applies_messages_twice_on_the_naive_design(
    db: DbConnection, schema: str
) -> None:
    """The race test can fail: partitions of the claim's own time miss a claim in the last one."""
    naive = Naive(schema)
    await naive.create(db)
    effects = await _race(naive, schema, db)
    doubled = {m: n for m, n in effects.items() if n > 1}
    assert doubled, "the naive design applied every message once: the race was not exercised"


async def _claim(db: DbConnection, schema: str, message_id: str, body: bytes) -> ClaimOutcome:
    key = DedupeKey(consumer="q", tenant="", message_id=message_id)
    async with db.transaction():
        [outcome] = await Inbox(schema).claim(db, [Claim(key=key, fingerprint=body)])
    return outcome


async def _age_ended(db: DbConnection, days: float) -> None:
    """As if every ended generation had ended `days` earlier than it did."""
    await db.execute(
        "UPDATE dedupe_generations SET ended_at = ended_at - $1::interval"
        " WHERE ended_at IS NOT NULL AND dropped_at IS NULL",
        timedelta(days=days),
    )


async def test_a_redelivery_generations_later_is_a_duplicate_and_after_retention_new(
    db: DbConnection, schema: str
) -> None:
    assert await _claim(db, schema, "order-1", b"a") is ClaimOutcome.NEW
    for _ in range(4):  # four rotations, each a cleanup run
        rotating = Retention(keep=timedelta(days=7), rotate_every=timedelta(microseconds=1))
        assert (await cleanup(db, schema, rotating)).rotated
    assert (await generations.current(db, schema, PROCESSED_MESSAGES)).number == 4
    retention = Retention(keep=timedelta(days=7), rotate_every=timedelta(days=1))
    assert await _claim(db, schema, "order-1", b"a") is ClaimOutcome.DUPLICATE
    assert await _claim(db, schema, "order-1", b"b") is ClaimOutcome.REUSED
    await _age_ended(db, 6)  # within retention still: nothing dropped
    assert (await cleanup(db, schema, retention)).generations_dropped == 0
    assert await _claim(db, schema, "order-1", b"a") is ClaimOutcome.DUPLICATE
    await _age_ended(db, 2)  # now generations 0 to 4 ended more than 7 days ago
    result = await cleanup(db, schema, retention)
    assert result.generations_dropped == 4  # 0 to 3; 4 is the current one
    assert await _claim(db, schema, "order-1", b"a") is ClaimOutcome.NEW


async def test_a_claim_outside_read_committed_is_refused(db: DbConnection, schema: str) -> None:
    """One snapshot per transaction would be taken before the rotation lock: refused."""
    key = DedupeKey(consumer="q", tenant="", message_id="m")
    with pytest.raises(asyncpg.RaiseError, match="needs READ COMMITTED"):
        async with db.transaction(isolation="repeatable_read"):
            await Inbox(schema).claim(db, [Claim(key=key, fingerprint=b"a")])


async def _statements(conn: DbConnection) -> list[str]:
    assert isinstance(conn, asyncpg.Connection)
    seen: list[str] = []
    conn.add_query_logger(lambda logged: seen.append(logged.query))
    return seen


def _deletes_of_claims(statements: Sequence[str]) -> list[str]:
    return [s for s in statements if "DELETE" in s.upper() and "processed_messages" in s]


async def test_cleanup_drops_a_generation_of_many_rows_with_no_delete(
    db: DbConnection, schema: str
) -> None:
    rows = 200_000
    await db.execute(
        "INSERT INTO processed_messages_g0 (consumer, tenant, message_id, fingerprint)"
        " SELECT 'q', '', 'm-' || n, '\\x00' FROM generate_series(1, $1) n",
        rows,
    )
    await db.execute("ANALYZE processed_messages_g0")
    retention = Retention(keep=timedelta(days=7), rotate_every=timedelta(microseconds=1))
    await cleanup(db, schema, retention)  # generation 1 is current, 0 ended
    await _age_ended(db, 8)
    issued = await _statements(db)
    result = await cleanup(db, schema, retention)
    assert result.generations_dropped == 1
    assert result.processed_messages == pytest.approx(rows, rel=0.05)  # the planner's estimate
    assert _deletes_of_claims(issued) == []
    assert any("DETACH PARTITION" in s and "CONCURRENTLY" in s for s in issued)
    assert any(s.startswith("DROP TABLE") for s in issued)
    assert await db.fetchval("SELECT to_regclass('processed_messages_g0')") is None
    assert await db.fetchval("SELECT count(*) FROM processed_messages") == 0


async def test_a_detach_cut_off_halfway_is_finished_by_the_next_cleanup(
    db: DbConnection, schema: str
) -> None:
    retention = Retention(keep=timedelta(days=7), rotate_every=timedelta(microseconds=1))
    await cleanup(db, schema, retention)
    await _age_ended(db, 8)
    # DETACH ... CONCURRENTLY's first transaction done, its second never run: the
    # state a cleaner leaves when its connection dies between the two.
    blocker = await asyncpg.connect(DATABASE_URL, timeout=ANSWER_S)
    detacher = await asyncpg.connect(DATABASE_URL, timeout=ANSWER_S)
    try:
        await blocker.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await blocker.fetchval(f'SELECT count(*) FROM "{schema}".processed_messages')
        detach = asyncio.create_task(
            detacher.execute(
                f'ALTER TABLE "{schema}".processed_messages'
                f' DETACH PARTITION "{schema}".processed_messages_g0 CONCURRENTLY'
            )
        )

        async def pending() -> bool:
            return bool(
                await db.fetchval(
                    "SELECT inhdetachpending FROM pg_inherits"
                    " WHERE inhrelid = 'processed_messages_g0'::regclass"
                )
            )

        async with asyncio.timeout(ANSWER_S):
            while not await pending():
                await asyncio.sleep(0.05)
        await db.execute("SELECT pg_terminate_backend($1)", detacher.get_server_pid())
        with pytest.raises((asyncpg.PostgresError, ConnectionError)):
            await within(ANSWER_S, "the cut-off detach", detach)
    finally:
        await blocker.close()
        detacher.terminate()
    assert await db.fetchval(
        "SELECT inhdetachpending FROM pg_inherits"
        " WHERE inhrelid = 'processed_messages_g0'::regclass"
    )
    result = await cleanup(db, schema, retention)
    assert result.generations_dropped == 1
    assert await db.fetchval("SELECT to_regclass('processed_messages_g0')") is None
