"""How late a poison job may be dead-lettered: from its retry policy and the run itself.

A poison job is handled `max_attempts` times. Between two attempts it waits
in a delay tier, and the broker dead-letters it back to the work queue,
where it waits again behind whatever is queued. Each trip through the work
queue can take as long as any job's delivery took in the same run (broker
restarts, killed workers, a backlog: every job pays for those alike). So:

    limit = tiers + broker path + attempts * delivery

    tiers         sum over attempts 1 .. max_attempts-1 of the tier the policy
                  picks for that attempt's largest backoff (full jitter draws at
                  most min(cap, base * 2**(attempt-1)); the tier is at or above it)
    broker path   (max_attempts - 1) * the broker's dead-letter confirm timeout:
                  a tier's at-least-once dead-lettering republishes a message
                  whose confirm did not come after that long (10 s on our nodes)
    delivery      the slowest confirmed-publish-to-effect time of the run's own
                  local jobs, measured from the effect table

A poison job past that limit waited for something the other jobs did not
(a tier held by the broker, a dead letter lost and republished late): that is
what the check catches, on a quiet machine or a busy one alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from consumers import RetryPolicy
from dedupe import DbConnection
from proving.chaos.services import DLX_CONFIRM_TIMEOUT_MS
from proving.chaos.workload import Job, JobKind


def tiers_seconds(policy: RetryPolicy) -> float:
    """The longest the policy's delay tiers hold a job over all its retries."""
    return sum(
        policy.tier_for(min(policy.cap_seconds, policy.base_seconds * 2 ** (attempt - 1)))
        for attempt in range(1, policy.max_attempts)
    )


def broker_path_seconds(policy: RetryPolicy) -> float:
    """The broker's dead-letter confirm timeout, once for each pass through a tier."""
    return (policy.max_attempts - 1) * DLX_CONFIRM_TIMEOUT_MS / 1000


def poison_limit(policy: RetryPolicy, delivery_s: float) -> float:
    """The latest a job that always fails may be dead-lettered after its publish."""
    return tiers_seconds(policy) + broker_path_seconds(policy) + policy.max_attempts * delivery_s


async def first_effects(db: DbConnection) -> dict[tuple[str, str], float]:
    """(tenant, message_id) -> when its first effect row was written (epoch seconds)."""
    rows = await db.fetch(
        "SELECT tenant, message_id, extract(epoch FROM min(applied_at)) AS at"
        " FROM chaos_effects GROUP BY 1, 2",
        timeout=30,
    )
    return {(r["tenant"], r["message_id"]): float(r["at"]) for r in rows}


def slowest_delivery(
    jobs: Sequence[Job],
    first_sent: Mapping[tuple[str, str], float],
    applied: Mapping[tuple[str, str], float],
    wall_offset: float,
) -> float:
    """The slowest local job from its first confirmed publish to its first effect.

    `first_sent` is monotonic; `wall_offset` turns it into the wall clock the
    database's `applied_at` is on.
    """
    slowest = 0.0
    for job in jobs:
        if job.kind is not JobKind.LOCAL:
            continue
        sent = first_sent.get((job.queue, job.message_id))
        done = applied.get((job.tenant, job.message_id))
        if sent is not None and done is not None:
            slowest = max(slowest, done - (sent + wall_offset))
    return slowest
