"""The send ledger: one row per (dedupe key, target) of an external effect.

A target is a device of a push job, a webhook endpoint, an e-mail recipient, the
resource an API call acts on: its `channel` names where it goes, its `address`
whom, its `effect_id` the stable id every attempt carries.

    claimed --take--> sending --record--> sent | failed
       ^                 |
       +----release------+   (transient error, or unknown outcome with RESEND)

`sending` holds a lease: a worker id and an expiry on PostgreSQL's clock.
While the lease is live another worker must not send (it requeues the job);
once it expired, the sender died mid-call and the outcome is unknown, so the
consumer's `UnknownOutcome` policy decides: RESEND (same ids, the device
collapses a duplicate, the provider replays or is asked first) or SKIP (mark it
failed). `first_sent_at` (PostgreSQL's clock, when the row was first leased) is
what a channel that replays by key counts its window from.

A worker whose sends outlast one lease extends it while it makes progress
(`extend`: one statement for every job it holds, compare-and-set on the owner
and the old expiry) and leases a job's targets in chunks (`open` and `take`
with `limit`), each new chunk at the expiry the others hold, so one value
renews them all.

Every transition is a compare-and-set (`UPDATE ... WHERE status = ...`), so
two workers racing for one row cannot both win, and each statement handles a
whole batch, its keys in sorted order. No transaction stays open while a
provider call is in flight: `open`/`take` commit before the call, `record`
commits after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import asyncpg

from dedupe.connection import DbConnection
from dedupe.generations import SEND_LEDGER, current_sql
from dedupe.inbox import DedupeKey
from dedupe.migrate import quote_ident

# The failure_reason of a `sending` row whose expired lease another worker took.
LEASE_EXPIRED = "unknown_outcome: lease_expired"


class SendStatus(StrEnum):
    CLAIMED = "claimed"
    SENDING = "sending"
    SENT = "sent"
    FAILED = "failed"


class UnknownOutcome(StrEnum):
    """What to do with a send whose outcome is unknown (crash or timeout mid-call)."""

    RESEND = "resend"  # send again with the same apns-id and collapse id
    SKIP = "skip"  # mark it failed: never risk a second notification


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class TargetKey:
    key: DedupeKey
    target_index: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SendIntent:
    """A target of a new job, with the ids every attempt will carry."""

    target: TargetKey
    channel: str
    address: str
    effect_id: str
    collapse_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SendRow:
    target: TargetKey
    channel: str
    address: str
    effect_id: str
    collapse_id: str
    status: SendStatus
    sends: int
    lease_seconds_left: float  # 0 unless `sending` with a live lease
    lease_expires_at: datetime | None
    mine: bool  # this worker holds the lease now: it must send
    # Seconds since the row was first leased, by PostgreSQL's clock at the statement
    # that read it (None: never leased): a replay window's start.
    since_first_lease: float | None
    provider_message_id: str | None
    failure_reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SendResult:
    """The answer for one target: `sent`, `failed`, or back to `claimed` (release)."""

    target: TargetKey
    status: SendStatus
    provider_message_id: str | None = None
    failure_reason: str | None = None


_COLUMNS = (
    "consumer, tenant, message_id, target_index, channel, address, effect_id::text, collapse_id,"
    " status, sends, provider_message_id, failure_reason, lease_owner,"
    " greatest(extract(epoch FROM lease_expires_at - now()), 0)::float8, lease_expires_at,"
    " CASE WHEN sends > 0 THEN"
    "  extract(epoch FROM now() - coalesce(first_sent_at, created_at))::float8 END"
)
# The expiry of a lease: a chunk taken later joins the one its job's rows hold ($n),
# else it starts now.
_EXPIRY = "coalesce(${held}::timestamptz, now() + make_interval(secs => ${secs}))"


class SendLedger:
    """The `send_ledger` table of one schema, for one worker (the lease owner)."""

    def __init__(self, schema: str, owner: str) -> None:
        self.owner = owner
        self._table = f"{quote_ident(schema)}.send_ledger"
        self._generation = current_sql(schema, SEND_LEDGER)
        self._record_current = _record_sql(self._table, self._generation)
        self._record_any = _record_sql(self._table, None)

    async def open(
        self,
        tx: DbConnection,
        intents: Sequence[SendIntent],
        lease_seconds: float,
        *,
        leased: int | None = None,
    ) -> datetime:
        """Write the intents of new jobs: the first `leased` targets of each job (all, if
        None) as `sending`, leased to this worker, the others `claimed`; return the expiry."""
        ordered = sorted(intents, key=lambda i: _lock_order(i.target))
        first = len(ordered) if leased is None else leased
        expiry: datetime = await tx.fetchval(
            f"WITH written AS (INSERT INTO {self._table} (generation, consumer, tenant,"
            " message_id, target_index, channel, address, effect_id, collapse_id, status,"
            " lease_owner, lease_expires_at, sends, first_sent_at)"
            f" SELECT {self._generation}, c, t, m, i, p, tok, a::uuid, col,"
            "  CASE WHEN i < $11 THEN 'sending' ELSE 'claimed' END,"
            "  CASE WHEN i < $11 THEN $9 END,"
            "  CASE WHEN i < $11 THEN now() + make_interval(secs => $10) END,"
            "  CASE WHEN i < $11 THEN 1 ELSE 0 END,"
            "  CASE WHEN i < $11 THEN now() END"
            " FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::text[],"
            "  $7::text[], $8::text[]) AS x(c, t, m, i, p, tok, a, col))"
            " SELECT now() + make_interval(secs => $10)",
            [i.target.key.consumer for i in ordered],
            [i.target.key.tenant for i in ordered],
            [i.target.key.message_id for i in ordered],
            [i.target.target_index for i in ordered],
            [i.channel for i in ordered],
            [i.address for i in ordered],
            [i.effect_id for i in ordered],
            [i.collapse_id for i in ordered],
            self.owner,
            lease_seconds,
            first,
        )
        return expiry

    async def take(
        self,
        tx: DbConnection,
        keys: Sequence[DedupeKey],
        lease_seconds: float,
        policy: UnknownOutcome,
        *,
        limit: int | None = None,
        held: datetime | None = None,
    ) -> list[SendRow]:
        """For jobs claimed before: lease what may be sent now; return every row.

        `claimed` rows, and `sending` rows whose lease expired (under RESEND),
        move to `sending` leased to this worker (`mine`; a taken-over lease
        reads `failure_reason == LEASE_EXPIRED`), at most `limit` per job, in
        target order, expiring at `held` (the lease the job's other rows hold)
        or `lease_seconds` from now. Under SKIP an expired `sending` row becomes
        `failed`. A live lease of another worker is left alone: the caller
        requeues that job.
        """
        if not keys:
            return []
        ordered = sorted(set(keys))
        arrays = (
            [k.consumer for k in ordered],
            [k.tenant for k in ordered],
            [k.message_id for k in ordered],
        )
        keys_sql = "unnest($1::text[], $2::text[], $3::text[]) AS k(c, t, m)"
        where = " WHERE (o.consumer, o.tenant, o.message_id) = (k.c, k.t, k.m)"
        match = f" FROM {keys_sql}{where}"
        if policy is UnknownOutcome.SKIP:
            await tx.execute(
                f"UPDATE {self._table} o SET status = 'failed', lease_owner = NULL,"
                " lease_expires_at = NULL, failure_reason = 'unknown_outcome_skipped',"
                " updated_at = now()" + match + " AND o.status = 'sending'"
                " AND o.lease_expires_at < now()",
                *arrays,
            )
        # A `sending` row taken here lost its sender mid-call: say so in its
        # failure_reason (SET reads the old status) until its answer is recorded.
        # The first `limit` takeable rows of each job, found and locked by the key's
        # index (LATERAL ... LIMIT), then updated by primary key, as `record` does.
        taken = await tx.fetch(
            "WITH chosen AS MATERIALIZED (SELECT r.consumer, r.tenant, r.message_id,"
            f" r.target_index FROM {keys_sql} CROSS JOIN LATERAL (SELECT r.* FROM {self._table} r"
            "  WHERE (r.consumer, r.tenant, r.message_id) = (k.c, k.t, k.m)"
            "  AND (r.status = 'claimed' OR (r.status = 'sending' AND r.lease_expires_at < now()))"
            "  ORDER BY r.target_index LIMIT $7 FOR UPDATE) AS r)"
            f" UPDATE {self._table} o SET status = 'sending', lease_owner = $4,"
            f" lease_expires_at = {_EXPIRY.format(held=8, secs=5)}, sends = o.sends + 1,"
            " first_sent_at = coalesce(o.first_sent_at, now()),"
            " failure_reason = CASE WHEN o.status = 'sending' THEN $6 ELSE o.failure_reason END,"
            " updated_at = now() FROM chosen AS x"
            " WHERE (o.consumer, o.tenant, o.message_id, o.target_index)"
            " = (x.consumer, x.tenant, x.message_id, x.target_index)"
            " RETURNING o.target_index, o.consumer, o.tenant, o.message_id",
            *arrays,
            self.owner,
            lease_seconds,
            LEASE_EXPIRED,
            limit,
            held,
        )
        mine = {
            TargetKey(key=DedupeKey(consumer=r[1], tenant=r[2], message_id=r[3]), target_index=r[0])
            for r in taken
        }
        rows = await tx.fetch(
            f"SELECT {_COLUMNS} FROM {self._table} o, {keys_sql}{where}"
            " ORDER BY o.consumer, o.tenant, o.message_id, o.target_index",
            *arrays,
        )
        return [_row(r, mine) for r in rows]

    async def extend(
        self,
        tx: DbConnection,
        keys: Sequence[DedupeKey],
        held: datetime,
        lease_seconds: float,
    ) -> tuple[datetime, dict[DedupeKey, int]]:
        """Renew this worker's live lease on the `sending` rows of `keys` expiring at `held`.

        One statement for all the jobs, a compare-and-set on the owner and the
        old expiry: a row whose lease lapsed, or that another worker took over,
        is not renewed. Returns the new expiry and, per job, the rows renewed.
        """
        ordered = sorted(set(keys))
        rows = await tx.fetch(
            f"WITH renewed AS (UPDATE {self._table} o"
            " SET lease_expires_at = now() + make_interval(secs => $5)"
            " FROM unnest($1::text[], $2::text[], $3::text[]) AS k(c, t, m)"
            " WHERE (o.consumer, o.tenant, o.message_id) = (k.c, k.t, k.m)"
            " AND o.status = 'sending' AND o.lease_owner = $4 AND o.lease_expires_at = $6"
            " AND o.lease_expires_at > now()"
            " RETURNING o.consumer, o.tenant, o.message_id)"
            " SELECT now() + make_interval(secs => $5), r.consumer, r.tenant, r.message_id,"
            "  count(r.message_id)::int"
            " FROM (SELECT 1) AS one LEFT JOIN renewed r ON true GROUP BY 2, 3, 4",
            [k.consumer for k in ordered],
            [k.tenant for k in ordered],
            [k.message_id for k in ordered],
            self.owner,
            lease_seconds,
            held,
        )
        expiry: datetime = rows[0][0]
        renewed = {
            DedupeKey(consumer=r[1], tenant=r[2], message_id=r[3]): r[4]
            for r in rows
            if r[3] is not None
        }
        return expiry, renewed

    async def record(self, tx: DbConnection, results: Sequence[SendResult]) -> list[TargetKey]:
        """Record provider answers on rows this worker still leases; return those recorded.

        A row whose lease another worker took over meanwhile is not touched:
        that worker's answer is the one that counts.
        """
        if not results:
            return []
        ordered = sorted(results, key=lambda r: _lock_order(r.target))
        # Most answers are for rows of the ledger's current generation: looked up there
        # first, one primary key probe each; the others (a job written before the last
        # rotation, a lease lost) then in every generation.
        recorded = await self._record(tx, ordered, self._record_current)
        if len(recorded) < len(ordered):
            done = set(recorded)
            rest = [n for n in range(len(ordered)) if n not in done]
            again = await self._record(tx, [ordered[n] for n in rest], self._record_any)
            recorded += [rest[n] for n in again]
        return [ordered[n].target for n in sorted(recorded)]

    async def _record(self, tx: DbConnection, ordered: Sequence[SendResult], sql: str) -> list[int]:
        """`record` in the generations `sql` looks in; the places in `ordered` recorded."""
        rows = await tx.fetch(
            sql,
            [r.target.key.consumer for r in ordered],
            [r.target.key.tenant for r in ordered],
            [r.target.key.message_id for r in ordered],
            [r.target.target_index for r in ordered],
            [str(r.status) for r in ordered],
            [r.provider_message_id for r in ordered],
            [r.failure_reason for r in ordered],
            self.owner,
        )
        return [r[0] - 1 for r in rows]


def _record_sql(table: str, generation: str | None) -> str:
    """`record`'s statement, in `table`'s generation `generation` (SQL; None: any)."""
    # The lease is checked, and the row locked, by one primary-key probe per
    # answer (LATERAL ... LIMIT 1): a filter on status and lease_owner in the
    # join itself let a planner with stale statistics (a fan-out burst leases
    # thousands of rows between two autovacuum runs) expect one such row and
    # rescan the whole table for every answer. Locked, a row keeps its lease
    # until the UPDATE, which then needs no second check.
    only = "" if generation is None else f"r.generation = {generation} AND"
    return (
        "WITH mine AS MATERIALIZED (SELECT x.*, r.generation"
        " FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[],"
        "  $6::text[], $7::text[]) WITH ORDINALITY AS x(c, t, m, i, s, pid, why, n)"
        f" CROSS JOIN LATERAL (SELECT r.generation FROM {table} r WHERE {only}"
        " (r.consumer, r.tenant, r.message_id, r.target_index) = (x.c, x.t, x.m, x.i)"
        "  AND r.status = 'sending' AND r.lease_owner = $8 LIMIT 1 FOR UPDATE) AS r)"
        f" UPDATE {table} o SET status = x.s, provider_message_id = x.pid,"
        " failure_reason = x.why, lease_owner = NULL, lease_expires_at = NULL,"
        " updated_at = now()"
        " FROM mine AS x"
        " WHERE o.generation = x.generation"  # one partition's primary key a row
        " AND (o.consumer, o.tenant, o.message_id, o.target_index) = (x.c, x.t, x.m, x.i)"
        " RETURNING x.n"  # the answer's place in `ordered`: no key read back
    )


def _lock_order(target: TargetKey) -> tuple[str, str, str, int]:
    """`target`'s place in the order rows are written and locked in: TargetKey's own
    order, as a flat tuple, so a sort compares in C and not through the dataclass'
    `__lt__` (about 1 us an answer of 500, down to 0.25)."""
    key = target.key
    return (key.consumer, key.tenant, key.message_id, target.target_index)


def _row(record: asyncpg.Record, mine: set[TargetKey]) -> SendRow:
    target = TargetKey(
        key=DedupeKey(consumer=record[0], tenant=record[1], message_id=record[2]),
        target_index=record[3],
    )
    status = SendStatus(record[8])
    return SendRow(
        target=target,
        channel=record[4],
        address=record[5],
        effect_id=record[6],
        collapse_id=record[7],
        status=status,
        sends=record[9],
        provider_message_id=record[10],
        failure_reason=record[11],
        lease_seconds_left=float(record[13] or 0.0) if status is SendStatus.SENDING else 0.0,
        lease_expires_at=record[14],
        mine=target in mine,
        since_first_lease=record[15],
    )
