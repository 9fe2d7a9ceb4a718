"""`python -m proving.fuzz`: generated raw messages through a real worker, each accounted for.

    python -m proving.fuzz --inputs 100000

Starts a private RabbitMQ node (never publishes its inputs to the configured
broker) and uses the configured PostgreSQL (DATABASE_URL) in a fresh schema
it drops after. Exit 0 when the worker never
crashed and every input ended as one effect or a dead letter with a reason.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from consumers import Settings, configure_logging
from proving.fuzz.run import FuzzOutcome, run_fuzz, summary_line

__all__ = ["FuzzOutcome", "main", "run_fuzz", "summary_line"]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m proving.fuzz", description=__doc__)
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(list(argv))
    configure_logging("warning")
    settings = Settings.from_env()
    outcome = asyncio.run(run_fuzz(settings.database.url, inputs=args.inputs, seed_value=args.seed))
    for log in [*outcome.crash_logs, *outcome.undecidable_lines]:
        print(log)
    for reason, count in sorted(outcome.reasons.items()):
        print(f"{'dead-lettered: ' + reason:<50}{count:>10}")
    print(summary_line(outcome))
    return 0 if outcome.ok else 1
