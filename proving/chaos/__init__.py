"""`idempotent-workers chaos`: faults on a schedule, then count lost and doubled.

    idempotent-workers chaos                  the CI profile (a few minutes)
    idempotent-workers chaos --profile full   100,000 messages, hundreds of faults
    idempotent-workers chaos --profile pg-failover  a Patroni cluster of 3 PostgreSQL
                                                    nodes, its primary killed 10 times,
                                                    switchovers, standby stops
                                                    (`pg-failover-ci`: 2 kills;
                                                    `--control async`: the same
                                                    without synchronous replication)
    idempotent-workers chaos --profile cluster      a 3-node cluster, its queue
                                                    leader killed 12 times, a rolling
                                                    restart (`cluster-ci`: 3 kills)

It runs against a private RabbitMQ node and PostgreSQL cluster it starts
itself (so it may crash them), never against the configured ones. Exit 0
when nothing was lost, doubled or stuck and every poison and malformed
message was dead-lettered in time.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from consumers import Settings, configure_logging
from proving.chaos.failover import ClusterOutcome, cluster_line, run_cluster_chaos
from proving.chaos.pg_failover import PgOutcome, pg_failover_line, run_pg_failover
from proving.chaos.pg_schedule import PG_PROFILES
from proving.chaos.profile import CLUSTER_PROFILES, PROFILES
from proving.chaos.report import (
    PushFigures,
    details,
    fault_table,
    push_details,
    summary_line,
)
from proving.chaos.run import Outcome, run_chaos
from proving.deadlines import task_stacks

RUN_TASK = "chaos-run"

__all__ = ["Outcome", "chaos_parser", "main", "run_chaos"]


def chaos_parser() -> argparse.ArgumentParser:
    """The flags of `idempotent-workers chaos`."""
    parser = argparse.ArgumentParser(
        prog="idempotent-workers chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--profile",
        choices=sorted([*PROFILES, *CLUSTER_PROFILES, *PG_PROFILES]),
        default="ci",
        help="the schedule of faults and the load (default %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=5, help="of the schedule: a run repeats with its seed"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    parser.add_argument(
        "--control",
        choices=["async"],
        help="pg-failover only: asynchronous replication, to show the check can fail",
    )
    return parser


def _on_sigterm() -> None:
    """Say where every task waits, then cancel the run so its teardown still runs.

    A caller that gives up on the run (a test's timeout) sends SIGTERM: the
    stacks say what the run was waiting for when it did.
    """
    print(f"chaos: SIGTERM; every task's stack:\n{task_stacks()}", file=sys.stderr, flush=True)
    for task in asyncio.all_tasks():
        if task.get_name() == RUN_TASK:
            task.cancel()


async def _guarded(profile: str, seed: int, keep: bool) -> Outcome:
    """Run; SIGTERM prints the stacks and cancels it (`_on_sigterm`)."""
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _on_sigterm)
    run = asyncio.create_task(run_chaos(PROFILES[profile], seed=seed, keep=keep), name=RUN_TASK)
    return await run  # unbounded: the run itself; each of its waits has a deadline


async def _guarded_cluster(profile: str, seed: int, keep: bool) -> ClusterOutcome:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _on_sigterm)
    run = asyncio.create_task(
        run_cluster_chaos(CLUSTER_PROFILES[profile], seed=seed, keep=keep), name=RUN_TASK
    )
    return await run  # unbounded: the run itself; each of its waits has a deadline


def _cluster(profile: str, seed: int, keep: bool) -> int:
    outcome = asyncio.run(_guarded_cluster(profile, seed, keep))
    f = outcome.findings
    print()
    rows = [
        ("publishes confirmed", outcome.published),
        ("publishes retried (same message_id)", outcome.republished),
        ("distinct local jobs", f.unique_local),
        ("effect rows", f.effects),
        ("poison dead-lettered", f"{f.poison_dead_lettered}/{f.poison}"),
        (f"poison slowest s (limit {f.poison_limit_s:.0f})", f"{f.poison_slowest_s:.1f}"),
        ("poison dead-lettered later than limit", f.poison_late),
        ("malformed dead-lettered", f"{f.malformed_dead_lettered}/{f.malformed}"),
        ("dead-letter copies (seen twice)", f.dead_letter_copies),
        ("node restarts", outcome.faults.node_restarts),
        ("node down to all queues online, s", f"{outcome.faults.downtime_s:.0f}"),
        ("elapsed s", f"{outcome.elapsed_s:.0f}"),
    ]
    for name, value in rows:
        print(f"{name:<40}{value!s:>12}")
    print(f"leaders killed: {' '.join(n.split('@')[0] for n in outcome.faults.leaders_seen)}")
    for stall in outcome.stalls:
        print(f"stalled: {stall}")
    print()
    print(cluster_line(outcome))
    return 0 if f.ok and not outcome.stalls else 1


async def _guarded_pg(profile: str, seed: int, keep: bool, control: bool) -> PgOutcome:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, _on_sigterm)
    run = asyncio.create_task(
        run_pg_failover(PG_PROFILES[profile], seed=seed, control=control, keep=keep),
        name=RUN_TASK,
    )
    return await run  # unbounded: the run itself; each of its waits has a deadline


def _pg(profile: str, seed: int, keep: bool, *, control: bool) -> int:
    outcome = asyncio.run(_guarded_pg(profile, seed, keep, control))
    f = outcome.faults
    print()
    print(f"{'distinct local jobs':<40}{outcome.unique_local:>12}")
    print(f"{'follow-ups (outbox, relays)':<40}{outcome.followups:>12}")
    sent = outcome.ingress
    print(f"{'send API requests':<40}{sent.requests:>12}")
    print(f"{'send API 202 (gave up)':<40}{f'{len(sent.accepted)} ({sent.gave_up})':>12}")
    print(f"{'acked (logged with their ids)':<40}{outcome.acked:>12}")
    elections = " ".join(f"{s:.1f}" for s in f.election_s)
    pauses = " ".join(f"{s:.1f}" for s in outcome.pauses_s)
    print(f"kill to new leader, s: {elections}")
    print(f"pause in effects per fault, s: {pauses}")
    gaps = " ".join(f"{s:.1f}" for s in outcome.commit_gaps_s)
    print(f"last commit before to first after each fault (workers' logs), s: {gaps}")
    print(f"{'elapsed s':<40}{outcome.elapsed_s:>12.0f}")
    print()
    print(pg_failover_line(outcome))
    # The control exists to show a loss: it succeeds when the check finds one.
    return 0 if outcome.ok != control else 1


def main(argv: Sequence[str], settings: Settings) -> int:
    """Entry point of `idempotent-workers chaos` (`settings` are not used: see above)."""
    del settings
    args = chaos_parser().parse_args(list(argv))
    configure_logging("warning")  # the run's own progress lines are what matters here
    if args.profile in PG_PROFILES:
        return _pg(args.profile, args.seed, args.keep, control=args.control == "async")
    if args.profile in CLUSTER_PROFILES:
        return _cluster(args.profile, args.seed, args.keep)
    outcome = asyncio.run(_guarded(args.profile, args.seed, args.keep))
    print()
    for line in fault_table(outcome.faults):
        print(line)
    print()
    for line in details(outcome.findings, outcome.fleet, outcome.published, outcome.republished):
        print(line)
    print(f"{'elapsed s':<40}{outcome.elapsed_s:>12.0f}")
    push = outcome.push
    if push is not None:
        for line in push_details(push):
            print(line)
    figures = (
        PushFigures(
            pushes=push.pushes,
            extra_pushes=push.extra_pushes,
            crashes_in_send=push.crashes_in_send,
        )
        if push is not None
        else PushFigures()
    )
    print()
    print(summary_line(outcome.findings, outcome.faults, figures))
    return 0 if outcome.findings.ok and (push is None or push.ok) else 1
