"""What a channel brings to its chaos run, and what its count says.

A channel (`Channel`) starts its receiver (a fake that behaves as the real
service, in the run's process), prepares the private database (webhook
endpoints, say), plans the jobs the run publishes, tells the workers where the
receiver is, and in the end counts at the receiver against the ledger and the
kills (`ChannelFindings`): one line per run,

    chaos.<channel>: jobs=... kills=... intents=... delivered=... lost=0
        arrived_twice=... duplicates=... on_the_wire_at_kills=... beyond_window=0 ...

then the channel's own figures, each named, and the counts that must be 0.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from dedupe import DbConnection
from proving.chaos.workload import TENANTS, Job, JobKind, compact_json
from proving.crash_window import Death, Tally
from proving.deadlines import ANSWER_S


@dataclass(frozen=True, slots=True, kw_only=True)
class ChannelFindings:
    channel: str
    tally: Tally
    figures: Mapping[str, int]  # what happened: verified, refused by script, replays...
    zero: Mapping[str, int]  # what must be 0: rejected deliveries, unsettled rows...
    exactly_once: bool = False  # replays by key or looked up: no duplicate at all

    @property
    def ok(self) -> bool:
        once = not self.exactly_once or self.tally.duplicates == 0
        return self.tally.ok and once and not any(self.zero.values())

    def line(self, *, jobs: int, kills: int) -> str:
        named = " ".join(f"{k}={v}" for k, v in {**self.figures, **self.zero}.items())
        return f"chaos.{self.channel}: jobs={jobs} kills={kills} {self.tally.fields()} {named}"


class Channel(Protocol):
    """One channel's part of a chaos run (see the module docstring)."""

    name: str
    queue: str

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def prepare(self, db: DbConnection) -> None:
        """Make what the jobs need in the run's database (endpoints, say)."""

    def plan(self, jobs: int, rng: random.Random) -> list[Job]:
        """The publishes, duplicates included; scripts the receiver for them."""

    def worker_env(self, workdir: Path) -> dict[str, str]:
        """Where the workers find the receiver (and what else they need to reach it)."""

    async def done(self, db: DbConnection) -> bool:
        """Every planned job has its ledger rows, and each is settled."""

    async def count(
        self, db: DbConnection, deaths: Sequence[Death], log_dir: Path
    ) -> ChannelFindings:
        """At the receiver, against the ledger, the deaths and the answers the workers
        logged as lost (`proving.crash_window.answers_lost`, in their logs in `log_dir`)."""


async def ledger_rows(db: DbConnection, queue: str) -> list[dict[str, object]]:
    """The ledger rows of `queue`'s jobs (status, address, effect_id, sends, message_id)."""
    rows = await db.fetch(
        "SELECT tenant, message_id, target_index, channel, address, effect_id::text AS effect_id,"
        " status, sends, failure_reason FROM send_ledger WHERE consumer = $1",
        queue,
        timeout=ANSWER_S,
    )
    return [dict(r) for r in rows]


async def settled(db: DbConnection, queue: str, jobs: int) -> bool:
    """Every distinct job of `queue` has rows, and none is claimed or sending."""
    row = await db.fetchrow(
        "SELECT count(DISTINCT message_id) AS jobs,"
        " count(*) FILTER (WHERE status IN ('claimed', 'sending')) AS open"
        " FROM send_ledger WHERE consumer = $1",
        queue,
        timeout=ANSWER_S,
    )
    return row is not None and row["jobs"] >= jobs and row["open"] == 0


def effect_job(queue: str, n: int, message_id: str, body: Mapping[str, Any]) -> Job:
    """A plan's n-th original: an effect job of `queue`, the tenants taking turns."""
    return Job(
        kind=JobKind.EFFECT,
        queue=queue,
        message_id=message_id,
        tenant=TENANTS[n % len(TENANTS)],
        body=compact_json(body),
    )
