"""Generations: tables whose rows leave by whole tables, never by DELETE.

A family is a table partitioned by generation; each generation is a table
of its own with its own primary key, listed in `dedupe_generations`.
Exactly one generation of a family is current: new rows go there. Two kinds:

- Claimed families (`processed_messages`, `ingress_idempotency_keys`:
  migration 0012) hold dedupe keys, which must be unique across all their
  generations; a claim does that, steps 1 and 3 below.
- Plain families (`send_ledger`, `ingress_messages`, `outbox`: migration
  0024) need no such key: a ledger row is written only for a job its claim
  made new, the others get fresh ids. A row goes to the generation current
  when written (the column's default, `dedupe_generation()`, or named by the
  writer); the rows that must outlive their generation (`Family.outlives`: a
  send not settled, a message still queued, an outbox row not published)
  move to the current generation before theirs is dropped (4.).

1. A claim (`claim_messages()`, `accept_messages()`: migration 0012) holds
   the schema's rotation lock shared until its transaction ends, then, in
   snapshots taken after that, reads which generation is current, looks its
   keys up in every older live generation (a key found there is a duplicate
   or a reuse, as before) and inserts the others into the current one, whose
   primary key decides two claimants of one key (ON CONFLICT DO NOTHING: the
   second waits for the first's commit). One statement, one round trip, as
   before.
2. `make_ahead` creates the next generations before they are needed: the
   table, its primary key, BRIN index and the family's partial indexes, a
   CHECK proving its bound, then ATTACH PARTITION, which takes SHARE UPDATE
   EXCLUSIVE on the parent: writes go on, and it reads nothing (the table is
   empty).
3. `rotate` makes the next generation of each family current, all in one
   short transaction holding the rotation lock exclusive. Taking it waits for
   every claim in flight to commit (each holds it shared) and claims arriving
   meanwhile wait behind it; so every claim ran wholly before the rotation
   (its rows committed in the old generation, which later claims look up) or
   wholly after (it sees the new current generation). No claim straddles it.
   The wait is bounded by `lock_timeout` (RotationBusy: try again later), so
   a slow batch holds claims up for that long at most.
4. `drop` removes a generation that ended longer ago than retention: every
   row written to it committed around or before its end, so is older than
   retention. A plain family's rows that must outlive it first move to the
   current generation (an UPDATE of the partition key, found through the
   partial index on just those rows). Then DETACH PARTITION ... CONCURRENTLY
   (SHARE UPDATE EXCLUSIVE on the parent; it waits for the transactions that
   may still read it, no write waits for it), then DROP TABLE: no row read or
   written, only the file system's unlink of its files. No claim writes an
   ended generation, so this needs no rotation lock; a lookup still reading
   it sees rows past retention, which a redelivery may find or not, as the
   contract allows. A detach cut off halfway (its connection lost) is
   finished (FINALIZE) by the next drop.

Only the cleaner rotates and drops (`dedupe.retention`, one cleaner per
schema at a time).

RotationBusy    the claims in flight did not let the rotation lock go within
                lock_timeout: nothing changed; rotate later
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from dedupe.connection import DbConnection
from dedupe.errors import DedupeError
from dedupe.migrate import quote_ident

# The rotation lock: the first key names the purpose, the second the schema.
# claim_messages() takes the same pair (hashtext(current_schema())) shared.
ROTATION_LOCK = "hashtext('idempotent-workers.generations'), hashtext($1)"
ROTATION_LOCK_TIMEOUT = "500ms"  # the longest a rotation may hold claims up


class RotationBusy(DedupeError):
    """Claims in flight held the rotation lock past lock_timeout: rotate later."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """A dedupe table kept in generations."""

    table: str  # the partitioned table
    key: tuple[str, ...]  # each generation's primary key (a claimed family's dedupe key)
    time_column: str  # when a row was written: each generation's BRIN index
    claimed: bool = False  # keys claimed across generations (1.), not plain rows
    # A plain family's rows that must outlive their generation (an SQL condition),
    # and each generation's partial index on them: (name suffix, columns).
    outlives: str | None = None
    outlives_index: tuple[str, str] | None = None

    def partition(self, number: int) -> str:
        return f"{self.table}_g{number}"


PROCESSED_MESSAGES = Family(
    table="processed_messages",
    key=("consumer", "tenant", "message_id"),
    time_column="processed_at",
    claimed=True,
)
# The send API's idempotency keys: accept_messages() (migration 0012) claims them.
INGRESS_KEYS = Family(
    table="ingress_idempotency_keys",
    key=("tenant", "idempotency_key"),
    time_column="created_at",
    claimed=True,
)
# Migration 0024's plain families. A send not settled stays (its job may still
# be sent), with its claim (dedupe.retention); the send API's message while
# `queued`; the outbox row until published.
UNSETTLED = "status IN ('claimed', 'sending')"
SEND_LEDGER = Family(
    table="send_ledger",
    key=("consumer", "tenant", "message_id", "target_index"),
    time_column="created_at",
    outlives=UNSETTLED,
    outlives_index=("unsettled", "consumer, tenant, message_id"),
)
INGRESS_MESSAGES = Family(
    table="ingress_messages",
    key=("id",),
    time_column="created_at",
    outlives="status = 'queued'",
    outlives_index=("queued", "id"),
)
OUTBOX = Family(
    table="outbox",
    key=("id",),
    time_column="created_at",
    outlives="published_at IS NULL",
    outlives_index=("pending", "id"),
)
# Dropped in this order: a plain family's rows that outlive their generation
# move first, then the claims kept for the ledger's are found (dedupe.retention).
FAMILIES = (SEND_LEDGER, INGRESS_MESSAGES, OUTBOX, PROCESSED_MESSAGES, INGRESS_KEYS)


def current_sql(schema: str, family: Family) -> str:
    """A scalar subquery of `family`'s current generation: read once a statement, where a
    writer names the generation of what it writes (the column's default, a function
    call, would read it once a row)."""
    return (
        f"(SELECT g.generation FROM {quote_ident(schema)}.dedupe_generations g"
        f" WHERE g.family = '{family.table}' AND g.began_at IS NOT NULL AND g.ended_at IS NULL)"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Generation:
    number: int
    began_at: datetime.datetime | None  # None: made ahead, not current yet
    ended_at: datetime.datetime | None  # None: current (or ahead)


async def live(conn: DbConnection, schema: str, family: Family) -> list[Generation]:
    """The generations of `family` not dropped, oldest first."""
    rows = await conn.fetch(
        f"SELECT generation, began_at, ended_at FROM {quote_ident(schema)}.dedupe_generations"
        " WHERE family = $1 AND dropped_at IS NULL ORDER BY generation",
        family.table,
    )
    return [Generation(number=r[0], began_at=r[1], ended_at=r[2]) for r in rows]


async def current(conn: DbConnection, schema: str, family: Family) -> Generation:
    """The generation claims insert into now."""
    for generation in await live(conn, schema, family):
        if generation.began_at is not None and generation.ended_at is None:
            return generation
    raise DedupeError(f"{schema}.{family.table} has no current generation")


async def make_ahead(
    conn: DbConnection, schema: str, family: Family, *, count: int = 1
) -> list[int]:
    """Create generations until `count` follow the current one; return those created (2.)."""
    q = quote_ident(schema)
    now = await current(conn, schema, family)
    have = {g.number for g in await live(conn, schema, family)}
    made = []
    for number in range(now.number + 1, now.number + 1 + count):
        if number in have:
            continue
        part = quote_ident(family.partition(number))
        key = ", ".join(quote_ident(c) for c in family.key)
        partial = ""
        if family.outlives_index is not None:
            suffix, columns = family.outlives_index
            partial = (
                f" CREATE INDEX {quote_ident(family.partition(number) + '_' + suffix)}"
                f"  ON {q}.{part} ({columns}) WHERE {family.outlives};"
            )
        async with conn.transaction():
            await conn.execute(
                f"CREATE TABLE {q}.{part} (LIKE {q}.{quote_ident(family.table)}"
                " INCLUDING DEFAULTS INCLUDING CONSTRAINTS);"
                f" ALTER TABLE {q}.{part} ALTER COLUMN generation SET DEFAULT {number},"
                f" ADD CONSTRAINT {quote_ident(family.partition(number) + '_generation')}"
                f"  CHECK (generation = {number}),"
                f" ADD CONSTRAINT {quote_ident(family.partition(number) + '_pkey')}"
                f"  PRIMARY KEY ({key});"
                f" CREATE INDEX {quote_ident(family.partition(number) + '_' + family.time_column)}"
                f"  ON {q}.{part} USING brin ({quote_ident(family.time_column)});"
                f"{partial}"
                f" ALTER TABLE {q}.{quote_ident(family.table)}"
                f"  ATTACH PARTITION {q}.{part} FOR VALUES IN ({number})"
            )
            await conn.execute(
                f"INSERT INTO {q}.dedupe_generations (family, generation) VALUES ($1, $2)",
                family.table,
                number,
            )
        made.append(number)
    return made


async def rotate(conn: DbConnection, schema: str, family: Family) -> int:
    """Make the next generation of `family` current (3.); return its number."""
    return (await rotate_together(conn, schema, (family,)))[family.table]


async def rotate_together(
    conn: DbConnection, schema: str, families: Sequence[Family]
) -> dict[str, int]:
    """Make the next generation of each family current, in one transaction (3.).

    Returns each family's new current generation, by table. Raises
    RotationBusy when the claims in flight keep the lock past
    ROTATION_LOCK_TIMEOUT; nothing changed then.
    """
    q = quote_ident(schema)
    for family in families:
        if family.claimed:
            await _drop_generation_default(conn, schema, family)
        await make_ahead(conn, schema, family, count=1)
    numbers = {}
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = '{ROTATION_LOCK_TIMEOUT}'")
        try:
            await conn.execute(f"SELECT pg_advisory_xact_lock({ROTATION_LOCK})", schema)
        except asyncpg.LockNotAvailableError as exc:
            raise RotationBusy(
                f"claims of {schema!r} held the rotation lock past {ROTATION_LOCK_TIMEOUT}"
            ) from exc
        for family in families:
            number: int | None = await conn.fetchval(
                f"WITH ended AS (UPDATE {q}.dedupe_generations SET ended_at = clock_timestamp()"
                "  WHERE family = $1 AND began_at IS NOT NULL AND ended_at IS NULL"
                "  RETURNING generation)"
                f" UPDATE {q}.dedupe_generations g SET began_at = clock_timestamp()"
                "  FROM ended WHERE g.family = $1 AND g.generation = ended.generation + 1"
                " RETURNING g.generation",
                family.table,
            )
            if number is None:  # no next generation: roll back rather than leave none current
                raise DedupeError(f"{schema}.{family.table}: no generation to make current")
            numbers[family.table] = number
    return numbers


async def _drop_generation_default(conn: DbConnection, schema: str, family: Family) -> None:
    """Before the first rotation: an INSERT that names no generation fails from then on."""
    has_default = await conn.fetchval(
        "SELECT a.atthasdef FROM pg_attribute a WHERE a.attrelid = $1::regclass"
        " AND a.attname = 'generation'",
        f"{quote_ident(schema)}.{quote_ident(family.table)}",
    )
    if has_default:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = '{ROTATION_LOCK_TIMEOUT}'")
            try:
                await conn.execute(
                    f"ALTER TABLE {quote_ident(schema)}.{quote_ident(family.table)}"
                    " ALTER COLUMN generation DROP DEFAULT"
                )
            except asyncpg.LockNotAvailableError as exc:
                raise RotationBusy(f"{schema}.{family.table} is busy: rotate later") from exc


async def expired(
    conn: DbConnection, schema: str, family: Family, keep: datetime.timedelta
) -> list[Generation]:
    """The generations that ended more than `keep` ago (their newest row is older)."""
    rows = await conn.fetch(
        f"SELECT generation, began_at, ended_at FROM {quote_ident(schema)}.dedupe_generations"
        " WHERE family = $1 AND dropped_at IS NULL AND ended_at < now() - $2::interval"
        " ORDER BY generation",
        family.table,
        keep,
    )
    return [Generation(number=r[0], began_at=r[1], ended_at=r[2]) for r in rows]


async def drop(conn: DbConnection, schema: str, family: Family, number: int) -> Dropped:
    """Move what outlives generation `number`, detach and drop it (4.).

    Must run outside a transaction (DETACH ... CONCURRENTLY cannot run in one).
    """
    q = quote_ident(schema)
    parent = f"{q}.{quote_ident(family.table)}"
    part = f"{q}.{quote_ident(family.partition(number))}"
    moved = 0
    if family.outlives is not None and await conn.fetchval("SELECT to_regclass($1)", part):
        # Row movement: a writer that locks a moved row meanwhile gets a
        # serialization failure and retries, finding it in the current generation.
        status = await conn.execute(
            f"UPDATE {parent} SET generation = {current_sql(schema, family)}"
            f" WHERE generation = $1 AND {family.outlives}",
            number,
        )
        moved = int(status.split()[-1])  # "UPDATE n"
    state = await conn.fetchrow(
        "SELECT c.oid IS NOT NULL AS exists, greatest(c.reltuples, 0)::float8 AS rows,"
        " i.inhrelid IS NOT NULL AS attached, coalesce(i.inhdetachpending, false) AS pending"
        " FROM (SELECT to_regclass($1) AS oid) r LEFT JOIN pg_class c ON c.oid = r.oid"
        " LEFT JOIN pg_inherits i ON i.inhrelid = r.oid",
        part,
    )
    assert state is not None
    if state["pending"]:  # a detach cut off halfway
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {part} FINALIZE")
    elif state["attached"]:
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {part} CONCURRENTLY")
    if state["exists"]:
        await conn.execute(f"DROP TABLE {part}")
    await conn.execute(
        f"UPDATE {q}.dedupe_generations SET dropped_at = now()"
        " WHERE family = $1 AND generation = $2",
        family.table,
        number,
    )
    return Dropped(rows=max(round(float(state["rows"] or 0.0)) - moved, 0), moved=moved)


@dataclass(frozen=True, slots=True, kw_only=True)
class Dropped:
    rows: int  # the generation's rows as the planner estimated them, less those moved
    moved: int  # rows that outlived it, now in the current generation
