"""The chaos run's poison limit follows from the retry policy and the run's own deliveries."""

from __future__ import annotations

from consumers import RetryPolicy
from dedupe import DbConnection
from proving.chaos.app import EFFECTS_TABLE, POISON_RETRY
from proving.chaos.latency import (
    broker_path_seconds,
    first_effects,
    poison_limit,
    slowest_delivery,
    tiers_seconds,
)
from proving.chaos.services import DLX_CONFIRM_TIMEOUT_MS
from proving.chaos.workload import Job, JobKind


def test_tiers_are_those_the_policy_picks_for_each_retry_s_largest_backoff() -> None:
    # Attempt 1 backs off up to 1 s (tier 1), attempt 2 up to 2 s (tier 5),
    # attempt 3 up to 4 s (tier 5); the fourth attempt is the last: no tier.
    policy = RetryPolicy(max_attempts=4, base_seconds=1.0, tiers_seconds=(1.0, 5.0, 30.0))
    assert tiers_seconds(policy) == 1.0 + 5.0 + 5.0
    # The cap bounds the backoff, and the largest tier bounds the cap's tier.
    capped = RetryPolicy(max_attempts=3, base_seconds=10.0, cap_seconds=12.0, tiers_seconds=(5.0,))
    assert tiers_seconds(capped) == 5.0 + 5.0


def test_the_poison_limit_adds_the_broker_path_and_a_delivery_per_attempt() -> None:
    tiers = tiers_seconds(POISON_RETRY)
    path = broker_path_seconds(POISON_RETRY)
    assert path == (POISON_RETRY.max_attempts - 1) * DLX_CONFIRM_TIMEOUT_MS / 1000
    assert poison_limit(POISON_RETRY, 0.0) == tiers + path
    slower = poison_limit(POISON_RETRY, 3.0) - poison_limit(POISON_RETRY, 0.0)
    assert slower == POISON_RETRY.max_attempts * 3.0


async def test_the_slowest_delivery_is_read_from_the_first_effect_of_each_local_job(
    db: DbConnection,
) -> None:
    await db.execute(EFFECTS_TABLE)
    # local-1's effect applied twice (a duplicate row): its first counts.
    await db.execute(
        "INSERT INTO chaos_effects (tenant, message_id, worker_pid, applied_at) VALUES"
        " ('t', 'local-1', 1, to_timestamp(1000.0)), ('t', 'local-1', 2, to_timestamp(1090.0)),"
        " ('t', 'local-2', 1, to_timestamp(1004.5))"
    )
    applied = await first_effects(db)
    assert applied == {("t", "local-1"): 1000.0, ("t", "local-2"): 1004.5}

    def job(mid: str, kind: JobKind = JobKind.LOCAL) -> Job:
        return Job(kind=kind, queue="chaos.local", message_id=mid, tenant="t", body=b"{}")

    jobs = [job("local-1"), job("local-2"), job("poison-1", JobKind.POISON)]
    # Confirmed at monotonic 9 and 10; the wall clock is monotonic + 990.
    sent = {("chaos.local", "local-1"): 9.0, ("chaos.local", "local-2"): 10.0}
    assert slowest_delivery(jobs, sent, applied, wall_offset=990.0) == 4.5
