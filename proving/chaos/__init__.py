"""`idempotent-workers chaos`: faults on a schedule, then count lost and doubled.

    idempotent-workers chaos                  the CI profile (a few minutes)
    idempotent-workers chaos --profile full   100,000 messages, hundreds of faults

It runs against a private RabbitMQ node and PostgreSQL cluster it starts
itself (so it may crash them), never against the configured ones. Exit 0
when nothing was lost, doubled or stuck and every poison and malformed
message was dead-lettered in time.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence

from consumers.logs import configure_logging
from consumers.settings import Settings
from proving.chaos.profile import PROFILES
from proving.chaos.report import (
    PushFigures,
    details,
    fault_table,
    push_details,
    summary_line,
)
from proving.chaos.run import Outcome, run_chaos

__all__ = ["Outcome", "main", "run_chaos"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idempotent-workers chaos", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="ci")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    return parser


async def _guarded(profile: str, seed: int, keep: bool) -> Outcome:
    """Run, turning SIGTERM into a cancellation so the teardown still runs."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    return await run_chaos(PROFILES[profile], seed=seed, keep=keep)


def main(argv: Sequence[str], settings: Settings) -> int:
    """Entry point of `idempotent-workers chaos` (`settings` are not used: see above)."""
    del settings
    args = _parser().parse_args(list(argv))
    configure_logging("warning")  # the run's own progress lines are what matters here
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
