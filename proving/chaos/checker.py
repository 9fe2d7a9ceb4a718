"""Count what was lost, doubled, stuck or dead-lettered, from the services alone.

Nothing here trusts a worker's own counters: effects are read from the
effect table, dead letters from what the watcher took off the dead-letter
queues, and stuck messages from the work and retry queues once the workers
are stopped (so nothing is unacked any more: every message left is ready).

    lost       a planned local job with no effect row, or an effect whose
               follow-up (emitted with it, published by a relay) never applied
    doubled    effect or follow-up rows beyond the first, per key
    stuck      messages still in a work queue or a retry tier, and outbox
               rows no relay published

Two figures are what happened, read from the workers' side because no
service records them: handler timeouts, from the workers' outcome lines
(`retry_scheduled`, reason `handler_timeout`); hangs, from the watchdog exits
(70) the fleet saw, each on a planned hang job. Whether those jobs then took
effect exactly once is counted from the effect table like every other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import aio_pika

from consumers import App, tier_queue
from dedupe import DbConnection
from proving.chaos.app import POISON_MAX_ATTEMPTS, POISON_QUEUE, SLOW_QUEUE, Act, follows_up
from proving.chaos.deadletters import DeadLetter
from proving.chaos.workload import Job, JobKind

# A count over the run's tables: well under a second on the private database.
QUERY_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Findings:
    messages: int
    unique_local: int
    effects: int
    lost: int
    doubled: int
    unexpected: int  # effect rows for keys nobody planned
    stuck: int
    dead_lettered: int  # distinct messages in the dead-letter queues
    dead_letter_copies: int
    local_dead_lettered: int  # valid local jobs that ended up dead-lettered
    poison: int
    poison_dead_lettered: int
    poison_slowest_s: float
    poison_limit_s: float  # proving.chaos.latency.poison_limit of this run
    poison_late: int  # dead-lettered later than poison_limit_s after publish
    max_attempts: int
    malformed: int
    malformed_dead_lettered: int
    decode_poison: int  # planned: fail outside the handler (proving.chaos.poison)
    decode_poison_dead_lettered: int  # with the reason its kind must get
    reasons: Mapping[str, int]
    lost_sample: Sequence[str]
    doubled_sample: Sequence[str]
    followups: int = 0  # follow-up rows applied (chaos_followups)
    followups_lost: int = 0  # effects whose follow-up never applied
    followups_doubled: int = 0  # follow-up rows beyond one per effect
    followups_unexpected: int = 0  # follow-ups of keys with no effect
    timeout_jobs: int = 0  # planned: await past their deadline on attempt 1
    handler_timeouts: int = 0  # of those, observed timing out (outcome lines)
    timeouts_effected: int = 0  # of those, with exactly one effect row
    other_timeouts: int = 0  # jobs that timed out with no plan to (slow under faults)
    hang_jobs: int = 0  # planned: block the event loop once
    hangs: int = 0  # watchdog exits (70) on a planned hang, as the fleet saw them
    hangs_effected: int = 0  # hang jobs with exactly one effect row
    unexpected_stuck: int = 0  # watchdog exits no planned hang explains
    innocent_sample: Sequence[str] = ()  # "queue message_id reason" of valid jobs dead-lettered

    @property
    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.doubled == 0
            and self.followups_lost == 0
            and self.followups_doubled == 0
            and self.followups_unexpected == 0
            and self.stuck == 0
            and self.unexpected == 0
            and self.poison_dead_lettered == self.poison
            and self.poison_late == 0
            and self.max_attempts <= POISON_MAX_ATTEMPTS
            and self.malformed_dead_lettered == self.malformed
            and self.decode_poison_dead_lettered == self.decode_poison
            and self.local_dead_lettered == 0
            and self.timeouts_effected == self.timeout_jobs
            # Most time out; one whose batch was retried whole (the database away)
            # before its handler ran comes back as attempt 2 and need not.
            and (self.handler_timeouts > 0 or self.timeout_jobs == 0)
            and self.hangs_effected == self.hang_jobs
            and self.hangs == self.hang_jobs
            and self.unexpected_stuck == 0
        )

    @property
    def innocent_dead_lettered(self) -> int:
        """Valid jobs dead-lettered: a batchmate's poison must never take them along."""
        return self.local_dead_lettered


async def count_stuck(
    channel: aio_pika.abc.AbstractChannel, app: App, *, patience: float = 10.0
) -> int:
    """Messages left in work queues and retry tiers (call with the workers stopped).

    A passive declare of a quorum queue waits on its leader: `patience` each.
    """
    total = 0
    for spec in app.specs.values():
        for name in [spec.queue, *(tier_queue(spec.queue, t) for t in spec.retry.tiers_seconds)]:
            queue = await channel.declare_queue(name, passive=True, timeout=patience)
            total += queue.declaration_result.message_count or 0
    return total


async def count_unpublished(db: DbConnection) -> int:
    """Outbox rows no relay has marked published."""
    count: int = await db.fetchval(
        "SELECT count(*) FROM outbox WHERE published_at IS NULL", timeout=QUERY_TIMEOUT_S
    )
    return count


async def followup_counts(db: DbConnection) -> dict[tuple[str, str], int]:
    rows = await db.fetch(
        "SELECT tenant, message_id, count(*) AS c FROM chaos_followups GROUP BY 1, 2",
        timeout=QUERY_TIMEOUT_S,
    )
    return {(r["tenant"], r["message_id"]): r["c"] for r in rows}


async def effect_counts(db: DbConnection) -> dict[tuple[str, str], int]:
    rows = await db.fetch(
        "SELECT tenant, message_id, count(*) AS c FROM chaos_effects GROUP BY 1, 2",
        timeout=QUERY_TIMEOUT_S,
    )
    return {(r["tenant"], r["message_id"]): r["c"] for r in rows}


def observed_timeouts(log_dir: Path) -> dict[str, int]:
    """message_id -> handler timeouts on chaos.slow, from the workers' outcome lines."""
    seen: dict[str, int] = {}
    for path in sorted(log_dir.glob("worker-*.log")):
        with path.open("rb") as lines:
            for raw in lines:
                if b"handler_timeout" not in raw:
                    continue
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # a line cut by a kill
                if (
                    isinstance(line, dict)
                    and line.get("reason") == "handler_timeout"
                    and line.get("consumer") == SLOW_QUEUE
                ):
                    key = str(line.get("message_id"))
                    seen[key] = seen.get(key, 0) + 1
    return seen


def check(
    *,
    jobs: Sequence[Job],
    effects: Mapping[tuple[str, str], int],
    dead: Mapping[tuple[str, str], DeadLetter],
    dead_copies: int,
    first_sent: Mapping[tuple[str, str], float],
    stuck: int,
    followups: Mapping[tuple[str, str], int] | None = None,
    timeouts: Mapping[str, int] | None = None,
    hangs: int = 0,
    unexpected_stuck: int = 0,
    poison_limit_s: float,
) -> Findings:
    """`followups` None: a run without relays, whose follow-ups are not counted.

    `poison_limit_s`: the latest a poison job may be dead-lettered after its
    publish in this run (`proving.chaos.latency.poison_limit`).

    `timeouts`: message_id -> handler timeouts seen (`observed_timeouts`);
    `hangs`, `unexpected_stuck`: the fleet's watchdog exits, explained or not.
    """
    timeouts = timeouts or {}
    counted = followups is not None
    followups = followups or {}
    local = {(j.tenant, j.message_id) for j in jobs if j.kind is JobKind.LOCAL}
    local_ids = {mid for _, mid in local}
    poison = [j for j in jobs if j.kind is JobKind.POISON]
    malformed = [j for j in jobs if j.kind is JobKind.MALFORMED]
    decode = [j for j in jobs if j.kind is JobKind.DECODE_POISON]
    timing_out = {j.message_id: j for j in jobs if j.act is Act.TIMEOUT and j.kind is JobKind.LOCAL}
    hanging = [j for j in jobs if j.act is Act.HANG and j.kind is JobKind.LOCAL]
    lost = sorted(mid for key in local if effects.get(key, 0) == 0 for mid in [key[1]])
    doubled = sorted(mid for key, c in effects.items() if c > 1 for mid in [key[1]])
    reasons: dict[str, int] = {}
    for letter in dead.values():
        reasons[letter.reason] = reasons.get(letter.reason, 0) + 1
    poison_letters = [
        dead[(POISON_QUEUE, j.message_id)] for j in poison if (POISON_QUEUE, j.message_id) in dead
    ]
    latencies = [
        letter.seen_at - first_sent[(POISON_QUEUE, letter.message_id)] for letter in poison_letters
    ]
    return Findings(
        messages=len(jobs),
        unique_local=len(local),
        effects=sum(effects.values()),
        lost=len(lost),
        doubled=sum(c - 1 for c in effects.values() if c > 1),
        unexpected=sum(1 for key in effects if key not in local),
        stuck=stuck,
        dead_lettered=len(dead),
        dead_letter_copies=dead_copies,
        local_dead_lettered=sum(1 for (_, mid) in dead if mid in local_ids),
        poison=len(poison),
        poison_dead_lettered=len(poison_letters),
        poison_slowest_s=max(latencies, default=0.0),
        poison_limit_s=poison_limit_s,
        poison_late=sum(1 for s in latencies if s > poison_limit_s),
        max_attempts=max((letter.attempt for letter in poison_letters), default=0),
        malformed=len(malformed),
        malformed_dead_lettered=sum(1 for j in malformed if (j.queue, j.message_id) in dead),
        decode_poison=len(decode),
        decode_poison_dead_lettered=sum(
            1 for j in decode if _reason_of(dead, j.queue, j.message_id) == j.expect
        ),
        reasons=reasons,
        lost_sample=lost[:10],
        doubled_sample=doubled[:10],
        followups=sum(followups.values()),
        followups_lost=sum(
            1 for key in effects if counted and follows_up(key[1]) and followups.get(key, 0) == 0
        ),
        followups_doubled=sum(c - 1 for c in followups.values() if c > 1),
        followups_unexpected=sum(
            1 for key in followups if key not in effects or not follows_up(key[1])
        ),
        timeout_jobs=len(timing_out),
        handler_timeouts=sum(1 for mid in timing_out if timeouts.get(mid, 0) > 0),
        timeouts_effected=sum(
            1 for j in timing_out.values() if effects.get((j.tenant, j.message_id)) == 1
        ),
        other_timeouts=sum(1 for mid in timeouts if mid not in timing_out),
        hang_jobs=len(hanging),
        hangs=hangs,
        hangs_effected=sum(1 for j in hanging if effects.get((j.tenant, j.message_id)) == 1),
        unexpected_stuck=unexpected_stuck,
        innocent_sample=sorted(
            f"{queue} {mid} {letter.reason}"
            for (queue, mid), letter in dead.items()
            if mid in local_ids
        )[:10],
    )


def _reason_of(dead: Mapping[tuple[str, str], DeadLetter], queue: str, key: str) -> str | None:
    found = dead.get((queue, key))
    return None if found is None else found.reason
